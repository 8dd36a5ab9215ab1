// SPDX-License-Identifier: Apache-2.0
// ReLU layer.
#include "models/layers/relu.h"

namespace dptrain {

Shape Relu::Setup(const Shape& in, const SetupOptions& opts) {
  per_sample_ = in.numel() / in[0];
  dx_buf_ = Tensor();  // Setup may run again
  if (folded_) return in;
  out_ = OutputBuffer(backend_, opts, in, DType::kF32, label() + " output");
  if (opts.need_dx && !gate_handed_)
    dx_buf_ = InputGradBuffer(backend_, opts, 0, in, DType::kF32, label() + " input gradient");
  return in;
}

const Tensor& Relu::Forward(const Tensor& x, const ForwardContext& /*ctx*/) {
  if (folded_) return x;
  y_ = out_.Batch(x.shape()[0]);
  backend_.ReluForward(x, &y_);
  return y_;
}

const Tensor& Relu::Backward(const Tensor& dy, bool /*accumulate*/) {
  if (folded_ || gate_handed_) return dy;
  if (dx_buf_.defined()) {
    dx_ = dx_buf_.Batch(y_.shape()[0]);
    backend_.ReluBackward(y_, dy, &dx_);
  }
  return dx_;
}

}  // namespace dptrain
