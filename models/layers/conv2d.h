// SPDX-License-Identifier: Apache-2.0
// 2-D convolution, as torch.nn.Conv2d: weight (K, C/groups, R, S), optional bias (K), square
// kernel, symmetric padding, groups (depthwise when groups = C) and dilation.
// x: (N, C, H, W) -> y: (N, K, P, Q).
#pragma once

#include <memory>

#include "models/layer.h"

namespace dptrain {

class Conv2d final : public Layer {
 public:
  Conv2d(Backend& be, std::string name, int64_t out_channels, int64_t kernel, int64_t stride,
         int64_t pad, bool bias, int64_t groups = 1, int64_t dilation = 1);
  std::string type() const override { return "conv2d"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  void ListParams(std::vector<ParamRef>* out) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override;
  // A strided 1x1 convolution offered to hand its input gradient sampled does so where the
  // backend writes it (Conv2dDesc::dx_sub).
  int64_t InputGradStride() const override { return desc_.dx_sub ? stride_ : 1; }
  void ListPlans(std::vector<const OpPlan*>* out) const override {
    if (plan_ != nullptr) out->push_back(plan_.get());
  }
  // The convolution applies the ReLU that alone reads it (Conv2dDesc::relu); backward gates dy by
  // the output, in place over it (no reader of the output is left by then).
  bool FoldRelu() override {
    relu_ = true;
    return true;
  }
  bool HandOverReluGate() override {
    gate_handed_ = relu_;
    return relu_;
  }
  bool TakesNhwc() const override { return true; }
  bool ChoosesNhwcOut() const override { return true; }
  // Fused with the pool after it, the pool reads this layer's input (Forward returns it).
  bool ForwardPassesInput() const override { return pool_fused_; }

  // A 2x2 max pool that alone reads this convolution's output (through its folded ReLU) offers to
  // run both as one op (ConvPoolDesc), before Setup; `pool` is the pool's descriptor without the
  // shapes. Setup takes the offer when the backend runs the fused op for the shapes it sees
  // (SetupOptions::fuse_conv_pool, no input gradient wanted): this layer then computes nothing,
  // its forward hands its input to the pool, and the pool computes the output and the gradients.
  void OfferPool(const PoolDesc& pool) {
    pool_offer_ = pool;
    pool_offered_ = true;
  }
  // After Setup: whether the pool runs this convolution, and the fused op's descriptor for the
  // pool's Setup and batch size (null otherwise).
  const ConvPoolDesc* pool_fused() const { return pool_fused_ ? &fused_ : nullptr; }
  // A layer that alone reads this convolution's output offers to write its gradient in bf16 (a
  // batch norm; the 2x2 max pool after the folded ReLU), before Setup. In bf16 the backward
  // rounds dy to bf16 before it reads it: Setup takes the offer where the backend runs both
  // (Conv2dDesc::dy_bf16 and Layer::CanWriteBf16Dx), and the reader asks reads_dy_bf16() at its
  // own Setup. The same bits, without the f32 gradient and the pass that rounded it.
  void OfferBf16Dy(const Layer* writer) { dy_writer_ = writer; }
  bool reads_dy_bf16() const { return !pool_fused_ && desc_.dy_bf16; }
  // Reading x in bf16 (Layer::OfferBf16Output): offered to the layer whose output only this one
  // reads, which answers before this layer's Setup.
  void FoldIntoInput(Layer& producer) override { producer.OfferBf16Output(*this); }
  bool WantsBf16Input() const override { return !pool_offered_; }
  bool CanReadBf16Input(const Shape& in, bool nhwc, Precision p) const override;
  void ReadBf16Input(bool bf16) override { x_bf16_ = bf16; }
  // Writing y in bf16 (Conv2dDesc::y_bf16): offered by the batch norm that alone reads it
  // (BatchNorm::ReadsOnlyOutputOf), whatever the folding. Setup takes the offer in bf16 where the
  // backend writes it and the batch norm reads it (CanReadBf16Input), and tells the batch norm
  // either way (ReadBf16Input) before its Setup.
  void OfferBf16Output(Layer& reader) override { y_reader_ = &reader; }
  bool writes_bf16_output() const { return desc_.y_bf16; }  // after Setup
  // What the pool's fused calls read: the input of the last forward, the parameters, gradients.
  const Tensor& input() const { return x_; }
  const Tensor& weight() const { return w_; }
  const Tensor* bias() const { return bias_ ? &b_ : nullptr; }
  Tensor* weight_grad() { return &gw_; }
  Tensor* bias_grad() { return bias_ ? &gb_ : nullptr; }

 private:
  void PrepareFor(int64_t n);

  int64_t out_channels_, kernel_, stride_, pad_, groups_, dilation_;
  bool bias_;
  bool relu_ = false;
  bool gate_handed_ = false;  // the max pool after the folded ReLU gates dy (HandOverReluGate)
  bool need_dx_ = true;
  bool pool_offered_ = false, pool_fused_ = false;
  bool x_bf16_ = false;  // ReadBf16Input
  PoolDesc pool_offer_;
  const Layer* dy_writer_ = nullptr;  // OfferBf16Dy
  Layer* y_reader_ = nullptr;         // OfferBf16Output
  ConvPoolDesc fused_;
  Conv2dDesc desc_;
  std::shared_ptr<OpPlan> plan_;
  Tensor w_, b_, gw_, gb_;
  Tensor out_, dx_buf_;  // (max N, ...)
  Tensor x_, y_, dx_;    // views for the current batch
};

}  // namespace dptrain
