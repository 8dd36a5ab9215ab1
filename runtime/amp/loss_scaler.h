// SPDX-License-Identifier: Apache-2.0
// Dynamic loss scaling for fp16 training (as torch.cuda.amp.GradScaler): the loss is multiplied
// by `scale` before backward so small gradients survive fp16; the optimizer divides it out. A
// non-finite gradient on ANY rank (the caller agrees over MPI first) skips the step on every
// rank and halves the scale; `growth_interval` clean steps in a row double it.
#pragma once

#include <cstdint>

namespace dptrain {

struct LossScalerState {
  double scale = 65536.0;     // 2^16
  int64_t good_steps = 0;     // clean steps since the last change
  int64_t skipped_steps = 0;  // total steps skipped for overflow
};

class LossScaler {
 public:
  explicit LossScaler(bool enabled, double initial = 65536.0, int64_t growth_interval = 2000,
                      double min_scale = 1.0, double max_scale = 16777216.0);

  bool enabled() const { return enabled_; }
  // The factor applied to the loss gradient (1 when disabled).
  float scale() const { return enabled_ ? static_cast<float>(state_.scale) : 1.f; }
  // After the agreement on this step's gradients: returns true when the optimizer step must be
  // skipped. Updates the scale.
  bool Update(bool found_non_finite_on_any_rank);
  // The scale cannot be halved any further: a skip now leaves it where it is.
  bool at_minimum() const { return enabled_ && state_.scale <= min_scale_; }

  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& s) { state_ = s; }

 private:
  bool enabled_;
  int64_t growth_interval_;
  double min_scale_, max_scale_;
  LossScalerState state_;
};

}  // namespace dptrain
