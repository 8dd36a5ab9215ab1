// SPDX-License-Identifier: Apache-2.0
// ReLU: y = max(x, 0); backward gates the gradient by the saved output (y > 0 <=> x > 0).
#pragma once

#include "models/layer.h"

namespace dptrain {

// What the graph's passes (models/passes/fuse.cc) decided for a ReLU, before its Setup.
struct ReluFusion {
  // The layer before applies it (a convolution, batch norm or residual sum whose output only this
  // ReLU reads): forward and backward pass through, and no buffers are held.
  bool folded = false;
  // Not folded, and the max pool that alone reads the output gates dy by its own output instead
  // (Pool2dFusion::gate_relu): backward passes dy through.
  bool gate_handed = false;
};

class Relu final : public Layer {
 public:
  Relu(Backend& be, std::string name) : Layer(be, std::move(name)) {}
  std::string type() const override { return "relu"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override {
    return fusion_.folded ? 0 : 4 * (dx_buf_.defined() ? 2 : 1) * per_sample_;
  }
  ReluFusion& fusion() { return fusion_; }
  bool folded() const { return fusion_.folded; }

 private:
  int64_t per_sample_ = 0;
  ReluFusion fusion_;
  Tensor out_, dx_buf_, y_, dx_;
};

}  // namespace dptrain
