// SPDX-License-Identifier: Apache-2.0
// The pointwise activations beyond ReLU (ew::Activation): clip (ReLU6), sigmoid, hard sigmoid,
// hard swish, tanh. Backward reads the saved input and output.
#pragma once

#include <string>

#include "core/elementwise.h"
#include "models/layer.h"

namespace dptrain {

class Activation final : public Layer {
 public:
  Activation(Backend& be, std::string name, ew::Activation f) : Layer(be, std::move(name)), f_(f) {}
  // "relu6", "clip", "sigmoid", "hardsigmoid", "hardswish", "tanh".
  std::string type() const override;
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override { return 4 * 2 * per_sample_; }

 private:
  ew::Activation f_;
  int64_t per_sample_ = 0;
  Tensor out_, dx_buf_, x_, y_, dx_;
};

}  // namespace dptrain
