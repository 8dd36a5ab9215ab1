// SPDX-License-Identifier: Apache-2.0
// Max and average pooling, as torch.nn.MaxPool2d / AvgPool2d with their ceil_mode and (for the
// average) count_include_pad. kernel = 0 means global pooling over the whole (H, W).
#pragma once

#include <memory>

#include "models/layer.h"
#include "models/layers/conv2d.h"

namespace dptrain {

// What the graph's passes (models/passes) decided for a pool, written before its Setup.
struct Pool2dFusion {
  // Before Setup (fuse.cc): a max pool that alone reads a ReLU's output (a ReLU layer's, or a
  // producer's with the ReLU folded in) gates its pooled gradient by its own output (> 0) before
  // scattering it to the window maxima. That is the ReLU's gate on the scattered gradient bit for
  // bit (a window's maximum is > 0 exactly when the ReLU passed it; every other position gets 0
  // either way) on a quarter of the elements for a 2x2 pool, and one pass over the ReLU's output
  // fewer.
  bool gate_relu = false;
  // The convolution before (through the folded ReLU) that a 2x2 max pool may run with
  // (Conv2dFusion::pool_fused: the pool's forward and backward then run the fused op), or whose
  // gradient this pool writes in bf16 (dx_bf16). Null: none.
  Conv2d* conv = nullptr;
  // At Setup (choose.cc): the input gradient in bf16, for that convolution's backward.
  bool dx_bf16 = false;
};

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

  Pool2dFusion& fusion() { return fusion_; }
  PoolKind kind() const { return kind_; }
  // The descriptor for input `in` (rank 4): channels-last input where nhwc, and an NCHW output
  // written from it where nchw_out (PoolDesc::y_nchw, where the layouts differ). No checks.
  PoolDesc DescFor(const Shape& in, bool nhwc, bool nchw_out = false) const;
  // As made: kernel (0: global), stride (0: the kernel), pad.
  int64_t kernel() const { return kernel_; }
  int64_t stride() const { return stride_; }
  int64_t pad() const { return pad_; }
  bool ceil_mode() const { return ceil_mode_; }

 private:
  PoolKind kind_;
  int64_t kernel_, stride_, pad_;
  bool ceil_mode_, count_include_pad_;
  bool need_dx_ = true;
  Pool2dFusion fusion_;
  PoolDesc desc_;
  std::shared_ptr<OpPlan> plan_;
  Tensor out_, dx_buf_, ws_;
  Tensor y_, dx_;
  bool have_ws_ = false;
  const ConvPoolDesc* fused_ = nullptr;  // the convolution's fused op, where it runs (after Setup)
};

}  // namespace dptrain
