// SPDX-License-Identifier: Apache-2.0
// Flatten layer.
#include "models/layers/flatten.h"

namespace dptrain {

Shape Flatten::Setup(const Shape& in, const SetupOptions& /*opts*/) {
  in_ = in;
  return Shape{in[0], in.numel() / in[0]};
}

const Tensor& Flatten::Forward(const Tensor& x, const ForwardContext& /*ctx*/) {
  const int64_t n = x.shape()[0];
  y_ = x.View(Shape{n, x.numel() / n});
  return y_;
}

const Tensor& Flatten::Backward(const Tensor& dy, bool /*accumulate*/) {
  dx_ = dy.View(in_.WithBatch(dy.shape()[0]));
  return dx_;
}

}  // namespace dptrain
