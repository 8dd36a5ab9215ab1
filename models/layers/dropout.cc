// SPDX-License-Identifier: Apache-2.0
// Dropout layer.
#include "models/layers/dropout.h"

#include <functional>
#include <string>

#include "core/elementwise.h"
#include "core/error.h"

namespace dptrain {

Shape Dropout::Setup(const Shape& in, const SetupOptions& opts) {
  DPT_CHECK_AS(ConfigError, p_ >= 0.f && p_ < 1.f)
      << "dropout '" << name_ << "': p = " << p_ << " must be in [0, 1)";
  per_sample_ = in.numel() / in[0];
  salt_ = std::hash<std::string>{}(name_);
  out_ = OutputBuffer(backend_, opts, in, DType::kF32, label() + " output");
  if (opts.need_dx)
    dx_buf_ = InputGradBuffer(backend_, opts, 0, in, DType::kF32, label() + " input gradient");
  return in;
}

uint64_t Dropout::MaskSeed(uint64_t run_seed, int64_t step, uint64_t layer_salt) {
  return (static_cast<uint64_t>(ew::Hash32(run_seed ^ layer_salt, static_cast<uint64_t>(step)))
          << 32) |
         ew::Hash32(layer_salt, run_seed + static_cast<uint64_t>(step));
}

const Tensor& Dropout::Forward(const Tensor& x, const ForwardContext& ctx) {
  y_ = out_.Batch(x.shape()[0]);
  if (!ctx.training || p_ == 0.f) {
    backend_.Copy(x, &y_);
    seed_ = 0;
    return y_;
  }
  // The mask of element i of this batch is the mask of element (offset + i) of the step's global
  // batch, so it is identical whatever the world size.
  seed_ = ew::ShiftSeed(MaskSeed(ctx.seed, ctx.step, salt_),
                        static_cast<uint64_t>(ctx.sample_offset * per_sample_));
  backend_.DropoutForward(x, p_, seed_, &y_);
  return y_;
}

const Tensor& Dropout::Backward(const Tensor& dy, bool /*accumulate*/) {
  if (!dx_buf_.defined()) return dx_;
  dx_ = dx_buf_.Batch(dy.shape()[0]);
  if (seed_ == 0) {
    backend_.Copy(dy, &dx_);
  } else {
    backend_.DropoutBackward(dy, p_, seed_, &dx_);
  }
  return dx_;
}

}  // namespace dptrain
