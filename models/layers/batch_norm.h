// SPDX-License-Identifier: Apache-2.0
// Batch normalisation over (N, H, W) per channel, as torch.nn.BatchNorm2d/1d: weight (gamma),
// bias (beta), buffers running_mean, running_var (momentum 0.1, eps 1e-5). Training normalises
// with the local batch's statistics (no cross-rank synchronisation, like DDP without SyncBN).
#pragma once

#include "models/layer.h"

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
  int64_t ActivationBytesPerSample() const override { return 4 * 2 * per_sample_; }
  bool FoldRelu() override {
    args_.relu = true;
    return true;
  }
  bool HandOverReluGate() override {
    gate_handed_ = args_.relu;
    return args_.relu;
  }
  bool TakesNhwc() const override { return true; }

 private:
  int64_t channels_ = 0, per_sample_ = 0;
  bool need_dx_ = true;
  bool gate_handed_ = false;  // the max pool after the folded ReLU gates dy (HandOverReluGate)
  BatchNormArgs args_;
  Tensor gamma_, beta_, ggamma_, gbeta_, running_mean_, running_var_;
  Tensor save_mean_, save_invstd_;
  Tensor out_, dx_buf_, x_, y_, dx_;
};

}  // namespace dptrain
