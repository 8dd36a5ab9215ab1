// SPDX-License-Identifier: Apache-2.0
// ReLU layer.
#include "models/layers/relu.h"

namespace dptrain {

Shape Relu::Setup(const Shape& in, const SetupOptions& opts) {
  per_sample_ = in.numel() / in[0];
  dx_buf_ = Tensor();  // Setup may run again
  flow_ = LayerFlow{};
  flow_.passes_gradient = flow_.passes_gradient_as_is = fusion_.folded || fusion_.gate_handed;
  flow_.forward_passes_input = fusion_.folded;
  if (fusion_.folded) return in;
  out_ = OutputBuffer(backend_, opts, in, DType::kF32, label() + " output");
  if (opts.need_dx && !fusion_.gate_handed)
    dx_buf_ = InputGradBuffer(backend_, opts, 0, in, DType::kF32, label() + " input gradient");
  return in;
}

const Tensor& Relu::Forward(const Tensor& x, const ForwardContext& /*ctx*/) {
  if (fusion_.folded) return x;
  y_ = out_.Batch(x.shape()[0]);
  backend_.ReluForward(x, &y_);
  return y_;
}

const Tensor& Relu::Backward(const Tensor& dy, bool /*accumulate*/) {
  if (fusion_.folded || fusion_.gate_handed) return dy;
  if (dx_buf_.defined()) {
    dx_ = dx_buf_.Batch(y_.shape()[0]);
    backend_.ReluBackward(y_, dy, &dx_);
  }
  return dx_;
}

}  // namespace dptrain
