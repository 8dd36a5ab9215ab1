// SPDX-License-Identifier: Apache-2.0
// Residual: y = main(x) + shortcut(x), shortcut = identity when empty; the building block of
// ResNets. Parameter names are prefixed with each branch's name (PrefixNames).
#pragma once

#include <memory>
#include <vector>

#include "models/layer.h"
#include "models/layers/sequential.h"

namespace dptrain {

class Residual final : public Layer {
 public:
  Residual(Backend& be, std::string name, std::unique_ptr<Sequential> main,
           std::unique_ptr<Sequential> shortcut);
  std::string type() const override { return "residual"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  void ListParams(std::vector<ParamRef>* out) override;
  void ListBuffers(std::vector<ParamRef>* out) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override;
  void ListPlans(std::vector<const OpPlan*>* out) const override;

 private:
  std::unique_ptr<Sequential> main_, shortcut_;
  bool need_dx_ = true;
  int64_t per_sample_ = 0;
  Tensor out_, dx_buf_, y_, dx_;
};

}  // namespace dptrain
