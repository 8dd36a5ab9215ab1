// SPDX-License-Identifier: Apache-2.0
// Flatten: (N, d1, d2, ...) -> (N, d1*d2*...), a view of its input (no copy) in NCHW order;
// Reshape to any per-sample shape of the same size, also a view.
#pragma once

#include <vector>

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

// (N, ...) -> (N, dims...), a view of its input: ONNX Reshape to a constant shape that keeps the
// batch. In `dims` (per sample), 0 copies the input's dimension at that place and one -1 takes
// what is left; Setup refuses a shape whose size differs from the input's (ConfigError).
class Reshape final : public Layer {
 public:
  Reshape(Backend& be, std::string name, std::vector<int64_t> dims)
      : Layer(be, std::move(name)), dims_(std::move(dims)) {}
  std::string type() const override { return "reshape"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;

 private:
  std::vector<int64_t> dims_;
  Shape in_, out_;
  Tensor y_, dx_;
};

}  // namespace dptrain
