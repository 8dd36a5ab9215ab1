// SPDX-License-Identifier: Apache-2.0
// Dynamic loss scaling.
#include "runtime/amp/loss_scaler.h"

#include <algorithm>

namespace dptrain {

LossScaler::LossScaler(bool enabled, double initial, int64_t growth_interval, double min_scale,
                       double max_scale)
    : enabled_(enabled),
      growth_interval_(growth_interval),
      min_scale_(min_scale),
      max_scale_(max_scale) {
  state_.scale = initial;
}

bool LossScaler::Update(bool found_non_finite_on_any_rank) {
  if (!enabled_) return false;
  if (found_non_finite_on_any_rank) {
    state_.scale = std::max(min_scale_, state_.scale * 0.5);
    state_.good_steps = 0;
    ++state_.skipped_steps;
    return true;
  }
  if (++state_.good_steps >= growth_interval_) {
    state_.scale = std::min(max_scale_, state_.scale * 2.0);
    state_.good_steps = 0;
  }
  return false;
}

}  // namespace dptrain
