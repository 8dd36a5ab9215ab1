// SPDX-License-Identifier: Apache-2.0
// 2-D convolution, as torch.nn.Conv2d: weight (K, C/groups, R, S), optional bias (K), square
// kernel, symmetric padding, groups (depthwise when groups = C) and dilation.
// x: (N, C, H, W) -> y: (N, K, P, Q).
#pragma once

#include <memory>

#include "models/layer.h"

namespace dptrain {

// What the graph's passes (models/passes) decided for a convolution, written before its Setup:
// the layer runs what this says and asks nobody anything.
struct Conv2dFusion {
  // Before Setup, from the graph's structure (models/passes/fuse.cc):
  // the ReLU that alone reads the output is applied here (Conv2dDesc::relu); backward gates dy by
  // the output, in place over it (no reader of the output is left by then) ...
  bool relu = false;
  // ... unless the max pool that alone reads the ReLU's output gates it (Pool2dFusion::gate_relu).
  bool gate_handed = false;
  // At Setup, from the shapes and the backend (models/passes/choose.cc): the input is read in
  // bf16 (Conv2dDesc::x_bf16), its producer writing it so ...
  bool x_bf16 = false;
  // ... the output written in bf16 for the layer that alone reads it (Conv2dDesc::y_bf16), the
  // output's gradient read in bf16 from the layer that alone writes it (Conv2dDesc::dy_bf16), the
  // input gradient handed on sampled (Conv2dDesc::dx_sub, LayerFlow::input_grad_stride) ...
  bool y_bf16 = false, dy_bf16 = false, dx_sub = false;
  // ... or the 2x2 max pool after the ReLU runs both as one op (`pool`, with the shapes, where the
  // backend supports it and no input gradient is wanted): this layer then computes nothing, its
  // forward hands its input to the pool, and the pool computes the output and the gradients.
  bool pool_fused = false;
  ConvPoolDesc pool;
};

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
  void ListPlans(std::vector<const OpPlan*>* out) const override {
    if (plan_ != nullptr) out->push_back(plan_.get());
  }

  Conv2dFusion& fusion() { return fusion_; }
  const Conv2dFusion& fusion() const { return fusion_; }
  // The descriptor for input `in` in the given layouts, with the ReLU and bf16 input the fusion
  // says, the rest unfused (what the passes ask the backend about). No checks.
  Conv2dDesc DescFor(const Shape& in, Precision p, bool x_nhwc, bool y_nhwc) const;
  // DescFor the Setup options, after the checks that name a shape this layer cannot take
  // (ConfigError).
  Conv2dDesc Describe(const Shape& in, const SetupOptions& opts) const;

  // After Setup: the fused op's descriptor (batch size of the last forward) where the pool after
  // this layer runs it, else null; whether backward reads dy in bf16; whether y is bf16.
  const ConvPoolDesc* pool_fused() const { return fusion_.pool_fused ? &fused_ : nullptr; }
  bool reads_dy_bf16() const { return !fusion_.pool_fused && desc_.dy_bf16; }
  bool writes_bf16_output() const { return desc_.y_bf16; }
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
  bool need_dx_ = true;
  Conv2dFusion fusion_;
  ConvPoolDesc fused_;  // fusion_.pool, its batch size the last forward's
  Conv2dDesc desc_;
  std::shared_ptr<OpPlan> plan_;
  Tensor w_, b_, gw_, gb_;
  Tensor out_, dx_buf_;  // (max N, ...)
  Tensor x_, y_, dx_;    // views for the current batch
};

}  // namespace dptrain
