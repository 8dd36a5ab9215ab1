// SPDX-License-Identifier: Apache-2.0
// Flatten: (N, d1, d2, ...) -> (N, d1*d2*...), a view of its input (no copy) in NCHW order.
#pragma once

#include "models/layer.h"

namespace dptrain {

// (N, d1, d2, ...) -> (N, d1*d2*...), in NCHW order as torch.flatten(x, 1).
class Flatten final : public Layer {
 public:
  Flatten(Backend& be, std::string name) : Layer(be, std::move(name)) {}
  std::string type() const override { return "flatten"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;

 private:
  Shape in_;
  Tensor y_, dx_;
};

}  // namespace dptrain
