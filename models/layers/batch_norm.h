// SPDX-License-Identifier: Apache-2.0
// Batch normalisation over (N, H, W) per channel, as torch.nn.BatchNorm2d/1d: weight (gamma),
// bias (beta), buffers running_mean, running_var (momentum 0.1, eps 1e-5). Training normalises
// with the local batch's statistics (no cross-rank synchronisation, like DDP without SyncBN).
#pragma once

#include "models/layer.h"
#include "models/layers/conv2d.h"

namespace dptrain {

class BatchNorm final : public Layer {
 public:
  // args: momentum and eps as PyTorch means them (defaults 0.1, 1e-5).
  BatchNorm(Backend& be, std::string name, const BatchNormArgs& args = {})
      : Layer(be, std::move(name)), args_(args) {}
  std::string type() const override { return "batchnorm"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  void ListParams(std::vector<ParamRef>* out) override;
  void ListBuffers(std::vector<ParamRef>* out) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  // the output and, when one is wanted, the input gradient (each f32, or bf16 for a convolution
  // that reads it so)
  int64_t ActivationBytesPerSample() const override {
    return ((deferred_      ? 0
             : args_.y_bf16 ? 2
                            : 4) +
            (need_dx_ ? (args_.dx_bf16 ? 2 : 4) : 0)) *
           per_sample_;
  }
  // The convolution that alone reads the output may read it in bf16 (Layer::OfferBf16Output).
  void OfferBf16Output(Layer& reader) override { reader_ = &reader; }
  // A convolution's batch norm offers to write its gradient in bf16 (Conv2d::OfferBf16Dy).
  void FoldIntoInput(Layer& producer) override;
  bool CanWriteBf16Dx(const Shape& in, bool nhwc) const override;
  // In bf16 the convolution before it may write its output in bf16 (Conv2dDesc::y_bf16), which
  // this batch norm then reads (BatchNormArgs::x_bf16): offered whatever the folding.
  void ReadsOnlyOutputOf(Layer& producer) override;
  bool CanReadBf16Input(const Shape& in, bool nhwc, Precision p) const override;
  void ReadBf16Input(bool bf16) override { args_.x_bf16 = bf16; }
  bool FoldRelu() override {
    args_.relu = true;
    return true;
  }
  bool HandOverReluGate() override {
    gate_handed_ = args_.relu;
    return args_.relu;
  }
  bool TakesNhwc() const override { return true; }
  // The residual sum that alone reads the output offers to apply the normalisation itself
  // (Backend::AffineAdd). Taken at Setup where the backend runs it (DefersBatchNormApply) on
  // channels-last images without a folded ReLU: Forward then computes the statistics and the
  // scale and shift (deferred_affine) and returns its input, and holds no output.
  void OfferDeferredApply() { defer_offered_ = true; }
  const Tensor* deferred_affine() const { return deferred_ ? &affine_ : nullptr; }
  bool ForwardPassesInput() const override { return deferred_; }
  // Channels-last on a backend that takes it (Backend::BatchNormBackwardSum).
  bool SumsGradientParts() const override { return args_.nhwc && backend_.TakesGradientParts(); }
  void BackwardInputsSum(const Tensor& dy_a, const Tensor& dy_b, int64_t b_stride, bool accumulate,
                         std::vector<const Tensor*>* dx) override;

 private:
  int64_t channels_ = 0, per_sample_ = 0;
  bool need_dx_ = true;
  bool gate_handed_ = false;  // the max pool after the folded ReLU gates dy (HandOverReluGate)
  bool defer_offered_ = false, deferred_ = false;  // OfferDeferredApply, and taken at Setup
  BatchNormArgs args_;
  Conv2d* conv_ = nullptr;   // the convolution this batch norm alone reads (FoldIntoInput)
  Layer* reader_ = nullptr;  // the convolution that alone reads this output (OfferBf16Output)
  Tensor gamma_, beta_, ggamma_, gbeta_, running_mean_, running_var_;
  Tensor save_mean_, save_invstd_;
  Tensor discard_mean_, discard_var_;  // the running update of a recomputed forward
  Tensor out_, dx_buf_, x_, y_, dx_;
  Tensor affine_;  // deferred: (2 * C) scale, then shift

  // Backward of dy, or of dy + *dy2.
  const Tensor& Grad(const Tensor& dy, const Tensor* dy2, bool accumulate);
};

}  // namespace dptrain
