// SPDX-License-Identifier: Apache-2.0
// Flatten: (N, d1, d2, ...) -> (N, d1*d2*...) in NCHW order, a view of its input (no copy), or
// one transposing copy of a channels-last input; Reshape to any per-sample shape of the same
// size, a view.
#pragma once

#include <vector>

#include "models/layer.h"

namespace dptrain {

// (N, d1, d2, ...) -> (N, d1*d2*...), in NCHW order as torch.flatten(x, 1) (the order the next
// linear layer's weights are in). A channels-last (N, C, H, W) input is transposed into that
// order (Backend::FromChannelsLast) and its gradient back: the graph then keeps the layers
// before it channels-last (ref_cnn's last convolution and pooling) and transposes the smaller
// tensor here, not the convolution's output. The output is never channels-last (2-D).
class Flatten final : public Layer {
 public:
  Flatten(Backend& be, std::string name) : Layer(be, std::move(name)) {}
  std::string type() const override { return "flatten"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override;

 private:
  Shape in_;
  bool transpose_ = false;  // a channels-last input with more than one channel and position
  Tensor out_, dx_buf_;     // the transposed copies (transpose_ only)
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
