// SPDX-License-Identifier: Apache-2.0
// ReLU: y = max(x, 0); backward gates the gradient by the saved output (y > 0 <=> x > 0).
#pragma once

#include "models/layer.h"

namespace dptrain {

class Relu final : public Layer {
 public:
  Relu(Backend& be, std::string name) : Layer(be, std::move(name)) {}
  std::string type() const override { return "relu"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  // the output, and the input gradient unless the gate went to a max pool or none is wanted
  int64_t ActivationBytesPerSample() const override {
    return folded_ ? 0 : 4 * (dx_buf_.defined() ? 2 : 1) * per_sample_;
  }
  void OfferBf16Output(Layer& reader) override {
    if (folded_) producer_->OfferBf16Output(reader);
  }
  void OfferBf16OutputToAll(const std::vector<Layer*>& readers) override {
    if (folded_) producer_->OfferBf16OutputToAll(readers);
  }
  void FoldIntoInput(Layer& producer) override {
    folded_ = folded_ || producer.FoldRelu();
    if (folded_) producer_ = &producer;
  }
  // Folded: the producer applies the ReLU and hands over its gate; else this layer's backward
  // passes dy through.
  bool HandOverReluGate() override {
    if (folded_) return producer_->HandOverReluGate();
    gate_handed_ = true;
    return true;
  }
  bool TakesNhwc() const override { return true; }  // elementwise: any layout
  bool folded() const { return folded_; }
  bool PassesGradient() const override { return folded_ || gate_handed_; }
  bool PassesGradientAsIs() const override { return folded_ || gate_handed_; }
  bool ForwardPassesInput() const override { return folded_; }
  Layer* folded_into() const { return producer_; }  // the layer applying it, when folded

 private:
  int64_t per_sample_ = 0;
  bool folded_ = false;        // the layer before applies it: forward and backward pass through
  bool gate_handed_ = false;   // the max pool after this gates dy (HandOverReluGate)
  Layer* producer_ = nullptr;  // the layer it is folded into
  Tensor out_, dx_buf_, y_, dx_;
};

}  // namespace dptrain
