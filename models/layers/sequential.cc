// SPDX-License-Identifier: Apache-2.0
// Sequential composite.
#include "models/layers/sequential.h"

#include "core/error.h"
#include "core/memory/caching_allocator.h"

namespace dptrain {

void PrefixNames(const std::string& prefix, size_t from, std::vector<ParamRef>* out) {
  if (prefix.empty()) return;
  for (size_t i = from; i < out->size(); ++i) (*out)[i].name = prefix + "." + (*out)[i].name;
}

Layer& Sequential::Add(std::unique_ptr<Layer> layer) {
  children_.push_back(std::move(layer));
  return *children_.back();
}

Shape Sequential::Setup(const Shape& in, const SetupOptions& opts) {
  Shape s = in;
  shapes_.clear();
  for (size_t i = 0; i < children_.size(); ++i) {
    SetupOptions o = opts;
    o.need_dx = opts.need_dx || i > 0;
    shapes_.push_back(s);
    // Out-of-memory reports name the layer whose buffers were being allocated.
    const AllocationScope scope(children_[i]->name().empty()
                                    ? children_[i]->type() + " #" + std::to_string(i)
                                    : children_[i]->name());
    s = children_[i]->Setup(s, o);
  }
  return s;
}

void Sequential::ListParams(std::vector<ParamRef>* out) {
  for (auto& c : children_) {
    const size_t from = out->size();
    c->ListParams(out);
    PrefixNames(c->name(), from, out);
  }
}

void Sequential::ListBuffers(std::vector<ParamRef>* out) {
  for (auto& c : children_) {
    const size_t from = out->size();
    c->ListBuffers(out);
    PrefixNames(c->name(), from, out);
  }
}

const Tensor& Sequential::Forward(const Tensor& x, const ForwardContext& ctx) {
  const Tensor* h = &x;
  for (auto& c : children_) h = &c->Forward(*h, ctx);
  return *h;
}

const Tensor& Sequential::Backward(const Tensor& dy, bool accumulate) {
  return BackwardEach(
      dy, accumulate, [](size_t) {}, [](size_t) {});
}

int64_t Sequential::ActivationBytesPerSample() const {
  int64_t total = 0;
  for (const auto& c : children_) total += c->ActivationBytesPerSample();
  return total;
}

void Sequential::ListPlans(std::vector<const OpPlan*>* out) const {
  for (const auto& c : children_) c->ListPlans(out);
}

}  // namespace dptrain
