// SPDX-License-Identifier: Apache-2.0
// Max and average pooling, as torch.nn.MaxPool2d / AvgPool2d with their ceil_mode and (for the
// average) count_include_pad. kernel = 0 means global pooling over the whole (H, W).
#pragma once

#include <memory>

#include "models/layer.h"
#include "models/layers/conv2d.h"

namespace dptrain {

class Pool2d final : public Layer {
 public:
  Pool2d(Backend& be, std::string name, PoolKind kind, int64_t kernel, int64_t stride, int64_t pad,
         bool ceil_mode = false, bool count_include_pad = true);
  std::string type() const override { return kind_ == PoolKind::kMax ? "maxpool" : "avgpool"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override;
  void ListPlans(std::vector<const OpPlan*>* out) const override {
    if (plan_ != nullptr) out->push_back(plan_.get());
  }
  // A max pool takes over the backward gate of the ReLU before it (Layer::HandOverReluGate), and
  // a 2x2 one offers to run the convolution before that ReLU with it (Conv2d::OfferPool).
  void FoldIntoInput(Layer& producer) override;
  bool CanWriteBf16Dx(const Shape& in, bool nhwc) const override;
  bool TakesNhwc() const override { return true; }
  // A global pool's output, (N, C, 1, 1), is one layout in NCHW and NHWC.
  bool ChoosesNhwcOut() const override { return kernel_ == 0; }
  bool CanWriteNchwFromNhwc(const Shape& in) const override;

 private:
  PoolKind kind_;
  int64_t kernel_, stride_, pad_;
  bool ceil_mode_, count_include_pad_;
  bool need_dx_ = true;
  PoolDesc desc_;
  std::shared_ptr<OpPlan> plan_;
  Tensor out_, dx_buf_, ws_;
  Tensor y_, dx_;
  bool have_ws_ = false;
  bool gate_relu_ = false;  // gates dy by the output first: the ReLU before handed it over
  Conv2d* conv_ = nullptr;  // offered to run this convolution (OfferPool)
  // nchw_out with nhwc: y and dy NCHW (PoolDesc::y_nchw) where that differs from channels-last.
  PoolDesc DescFor(const Shape& in, bool nhwc, bool nchw_out = false) const;
  const ConvPoolDesc* fused_ = nullptr;  // and runs it: the fused op (after Setup)
};

}  // namespace dptrain
