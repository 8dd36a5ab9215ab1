// SPDX-License-Identifier: Apache-2.0
// Activation layer: one backend call each way.
#include "models/layers/activation.h"

namespace dptrain {

std::string Activation::type() const {
  switch (f_.kind) {
    case ew::ActKind::kClip:
      return f_.a == 0.f && f_.b == 6.f ? "relu6" : "clip";
    case ew::ActKind::kSigmoid:
      return "sigmoid";
    case ew::ActKind::kHardSigmoid:
      return "hardsigmoid";
    case ew::ActKind::kHardSwish:
      return "hardswish";
    case ew::ActKind::kTanh:
      return "tanh";
  }
  return "activation";
}

Shape Activation::Setup(const Shape& in, const SetupOptions& opts) {
  per_sample_ = in.numel() / in[0];
  out_ = OutputBuffer(backend_, opts, in, DType::kF32, label() + " output");
  if (opts.need_dx)
    dx_buf_ = InputGradBuffer(backend_, opts, 0, in, DType::kF32, label() + " input gradient");
  return in;
}

const Tensor& Activation::Forward(const Tensor& x, const ForwardContext& /*ctx*/) {
  x_ = x;
  y_ = out_.Batch(x.shape()[0]);
  backend_.ActivationForward(f_, x, &y_);
  return y_;
}

const Tensor& Activation::Backward(const Tensor& dy, bool /*accumulate*/) {
  if (dx_buf_.defined()) {
    dx_ = dx_buf_.Batch(y_.shape()[0]);
    backend_.ActivationBackward(f_, x_, y_, dy, &dx_);
  }
  return dx_;
}

}  // namespace dptrain
