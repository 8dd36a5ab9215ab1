// SPDX-License-Identifier: Apache-2.0
// Batch normalisation over (N, H, W) per channel, as torch.nn.BatchNorm2d/1d: weight (gamma),
// bias (beta), buffers running_mean, running_var (momentum 0.1, eps 1e-5). Training normalises
// with the local batch's statistics (no cross-rank synchronisation, like DDP without SyncBN).
#pragma once

#include "models/layer.h"

namespace dptrain {

// What the graph's passes (models/passes) decided for a batch norm, written before its Setup.
struct BatchNormFusion {
  // Before Setup (fuse.cc): the ReLU that alone reads the output is applied here
  // (BatchNormArgs::relu), and the max pool that alone reads the ReLU's output gates dy instead
  // of this layer (gate_handed).
  bool relu = false;
  bool gate_handed = false;
  // At Setup (choose.cc): the input is read in bf16 (the convolution before writes it so), the
  // output written in bf16 for the convolution that alone reads it, the input gradient written in
  // bf16 for the convolution before that reads it so (BatchNormArgs::x_bf16, y_bf16, dx_bf16) ...
  bool x_bf16 = false, y_bf16 = false, dx_bf16 = false;
  // ... or the residual sum that alone reads the output applies the normalisation itself
  // (Backend::AffineAdd, AddFusion::applies): Forward then computes the statistics and the scale
  // and shift (deferred_affine) and returns its input, and holds no output.
  bool deferred = false;
};

class BatchNorm final : public Layer {
 public:
  // args: momentum and eps as PyTorch means them (defaults 0.1, 1e-5).
  BatchNorm(Backend& be, std::string name, const BatchNormArgs& args = {})
      : Layer(be, std::move(name)), base_(args), args_(args) {}
  std::string type() const override { return "batchnorm"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  void ListParams(std::vector<ParamRef>* out) override;
  void ListBuffers(std::vector<ParamRef>* out) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  // the output and, when one is wanted, the input gradient (each f32, or bf16 for a convolution
  // that reads it so)
  int64_t ActivationBytesPerSample() const override {
    return ((fusion_.deferred ? 0
             : args_.y_bf16   ? 2
                              : 4) +
            (need_dx_ ? (args_.dx_bf16 ? 2 : 4) : 0)) *
           per_sample_;
  }
  // Channels-last on a backend that takes it (BackendCapabilities::gradient_parts,
  // Backend::BatchNormBackwardSum): LayerFlow::sums_gradient_parts.
  void BackwardInputsSum(const Tensor& dy_a, const Tensor& dy_b, int64_t b_stride, bool accumulate,
                         std::vector<const Tensor*>* dx) override;

  BatchNormFusion& fusion() { return fusion_; }
  const BatchNormFusion& fusion() const { return fusion_; }
  // The arguments it was made with, and the folded ReLU: what the passes ask the backend about.
  BatchNormArgs BaseArgs() const {
    BatchNormArgs a = base_;
    a.relu = fusion_.relu;
    return a;
  }
  // After Setup: the scale and shift the reading sum applies, when deferred (else null).
  const Tensor* deferred_affine() const { return fusion_.deferred ? &affine_ : nullptr; }

 private:
  int64_t channels_ = 0, per_sample_ = 0;
  bool need_dx_ = true;
  BatchNormFusion fusion_;
  const BatchNormArgs base_;  // as made
  BatchNormArgs args_;        // as set up
  Tensor gamma_, beta_, ggamma_, gbeta_, running_mean_, running_var_;
  Tensor save_mean_, save_invstd_;
  Tensor discard_mean_, discard_var_;  // the running update of a recomputed forward
  Tensor out_, dx_buf_, x_, y_, dx_;
  Tensor affine_;  // deferred: (2 * C) scale, then shift

  // Backward of dy, or of dy + *dy2.
  const Tensor& Grad(const Tensor& dy, const Tensor* dy2, bool accumulate);
};

}  // namespace dptrain
