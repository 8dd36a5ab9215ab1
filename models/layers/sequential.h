// SPDX-License-Identifier: Apache-2.0
// Sequential: a chain of layers, like torch.nn.Sequential; children's parameter names are
// prefixed with the child's name (PrefixNames, also used by Residual).
#pragma once

#include <memory>
#include <vector>

#include "models/layer.h"

namespace dptrain {

class Sequential final : public Layer {
 public:
  Sequential(Backend& be, std::string name) : Layer(be, std::move(name)) {}
  std::string type() const override { return "sequential"; }
  Layer& Add(std::unique_ptr<Layer> layer);
  const std::vector<std::unique_ptr<Layer>>& children() const { return children_; }
  bool empty() const { return children_.empty(); }

  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  void ListParams(std::vector<ParamRef>* out) override;
  void ListBuffers(std::vector<ParamRef>* out) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override;
  void ListPlans(std::vector<const OpPlan*>* out) const override;

  // Backward that reports after each child: `after(i)` is called once child i's parameter
  // gradients are final (children run last to first). Used by the Model for gradient buckets.
  // `before(i)` runs before child i's backward.
  template <class B, class F>
  const Tensor& BackwardEach(const Tensor& dy, bool accumulate, B before, F after) {
    const Tensor* g = &dy;
    for (size_t i = children_.size(); i-- > 0;) {
      before(i);
      g = &children_[i]->Backward(*g, accumulate);
      after(i);
    }
    return *g;
  }

 private:
  std::vector<std::unique_ptr<Layer>> children_;
  std::vector<Shape> shapes_;  // input shape of each child
};

// Prefixes the names of the entries appended to `out` since index `from` with "prefix.".
void PrefixNames(const std::string& prefix, size_t from, std::vector<ParamRef>* out);

}  // namespace dptrain
