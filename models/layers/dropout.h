// SPDX-License-Identifier: Apache-2.0
// Dropout: inverted (kept elements scaled by 1/(1-p)); the mask is regenerated from a
// counter-based hash in backward instead of stored, and is the same whatever the world size.
#pragma once

#include <cstdint>

#include "models/layer.h"

namespace dptrain {

class Dropout final : public Layer {
 public:
  Dropout(Backend& be, std::string name, float p) : Layer(be, std::move(name)), p_(p) {}
  std::string type() const override { return "dropout"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override { return 4 * 2 * per_sample_; }
  // The seed of the mask for a forward: a function of (run seed, step, layer) only; the element
  // index is offset by the batch's position in the global batch.
  static uint64_t MaskSeed(uint64_t run_seed, int64_t step, uint64_t layer_salt);

 private:
  float p_;
  int64_t per_sample_ = 0;
  uint64_t salt_ = 0;
  uint64_t seed_ = 0;  // 0: the last forward was the identity
  Tensor out_, dx_buf_, y_, dx_;
};

}  // namespace dptrain
