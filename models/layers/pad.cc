// SPDX-License-Identifier: Apache-2.0
// Pad layer: one Backend::Pad2d each way (the gradient crops what the forward padded).
#include "models/layers/pad.h"

#include "core/error.h"

namespace dptrain {

Shape Pad2d::Setup(const Shape& in, const SetupOptions& opts) {
  DPT_CHECK_AS(ConfigError, in.rank() == 4)
      << "pad '" << label() << "' needs (N, C, H, W) input, got " << in.ToString();
  Shape out{in[0], in[1], in[2] + top_ + bottom_, in[3] + left_ + right_};
  DPT_CHECK_AS(ConfigError, out[2] > 0 && out[3] > 0)
      << "pad '" << label() << "': padding (top " << top_ << ", left " << left_ << ", bottom "
      << bottom_ << ", right " << right_ << ") crops all of input " << in.ToString();
  in_per_sample_ = in.numel() / in[0];
  out_per_sample_ = out.numel() / out[0];
  out_ = OutputBuffer(backend_, opts, out, DType::kF32, label() + " output");
  dx_buf_ = opts.need_dx
                ? InputGradBuffer(backend_, opts, 0, in, DType::kF32, label() + " input gradient")
                : Tensor();
  if (!opts.need_dx) in_per_sample_ = 0;
  return out;
}

const Tensor& Pad2d::Forward(const Tensor& x, const ForwardContext& /*ctx*/) {
  y_ = out_.Batch(x.shape()[0]);
  backend_.Pad2d(x, top_, left_, &y_);
  return y_;
}

const Tensor& Pad2d::Backward(const Tensor& dy, bool /*accumulate*/) {
  if (dx_buf_.defined()) {
    dx_ = dx_buf_.Batch(dy.shape()[0]);
    backend_.Pad2d(dy, -top_, -left_, &dx_);
  }
  return dx_;
}

}  // namespace dptrain
