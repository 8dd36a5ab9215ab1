// SPDX-License-Identifier: Apache-2.0
// Fully connected layer, as torch.nn.Linear: y = x W^T + b, W (out, in). x: (N, in).
#pragma once

#include <memory>

#include "models/layer.h"

namespace dptrain {

class Linear final : public Layer {
 public:
  Linear(Backend& be, std::string name, int64_t out_features, bool bias);
  std::string type() const override { return "linear"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  void ListParams(std::vector<ParamRef>* out) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override;
  void ListPlans(std::vector<const OpPlan*>* out) const override { out->push_back(plan_.get()); }

 private:
  int64_t out_features_;
  bool bias_;
  bool need_dx_ = true;
  LinearDesc desc_;
  std::shared_ptr<OpPlan> plan_;
  Tensor w_, b_, gw_, gb_;
  Tensor out_, dx_buf_;
  Tensor x_, y_, dx_;
};

}  // namespace dptrain
