// SPDX-License-Identifier: Apache-2.0
// Residual layer: y = main(x) + shortcut(x).
#include "models/layers/residual.h"

#include "core/error.h"
#include "core/memory/caching_allocator.h"

namespace dptrain {

void Residual::ListPlans(std::vector<const OpPlan*>* out) const {
  main_->ListPlans(out);
  shortcut_->ListPlans(out);
}

Residual::Residual(Backend& be, std::string name, std::unique_ptr<Sequential> main,
                   std::unique_ptr<Sequential> shortcut)
    : Layer(be, std::move(name)), main_(std::move(main)), shortcut_(std::move(shortcut)) {}

Shape Residual::Setup(const Shape& in, const SetupOptions& opts) {
  SetupOptions o = opts;
  o.need_dx = true;  // both branches' input gradients are summed into dx
  Shape a = main_->Setup(in, o);
  const Shape b = shortcut_->empty() ? in : shortcut_->Setup(in, o);
  DPT_CHECK_AS(ConfigError, a == b) << "residual '" << name_ << "': main branch gives "
                                    << a.ToString() << " but shortcut gives " << b.ToString();
  need_dx_ = opts.need_dx;
  per_sample_ = a.numel() / a[0];
  out_ = backend_.Empty(a, DType::kF32, label() + " output");
  if (need_dx_) dx_buf_ = backend_.Empty(in, DType::kF32, label() + " input gradient");
  return a;
}

void Residual::ListParams(std::vector<ParamRef>* out) {
  size_t from = out->size();
  main_->ListParams(out);
  PrefixNames(main_->name(), from, out);
  from = out->size();
  shortcut_->ListParams(out);
  PrefixNames(shortcut_->name(), from, out);
}

void Residual::ListBuffers(std::vector<ParamRef>* out) {
  size_t from = out->size();
  main_->ListBuffers(out);
  PrefixNames(main_->name(), from, out);
  from = out->size();
  shortcut_->ListBuffers(out);
  PrefixNames(shortcut_->name(), from, out);
}

const Tensor& Residual::Forward(const Tensor& x, const ForwardContext& ctx) {
  const Tensor& a = main_->Forward(x, ctx);
  const Tensor& b = shortcut_->empty() ? x : shortcut_->Forward(x, ctx);
  y_ = out_.Batch(x.shape()[0]);
  backend_.Add(a, b, &y_);
  return y_;
}

const Tensor& Residual::Backward(const Tensor& dy, bool accumulate) {
  const Tensor& da = main_->Backward(dy, accumulate);
  const Tensor& db = shortcut_->empty() ? dy : shortcut_->Backward(dy, accumulate);
  if (need_dx_) {
    dx_ = dx_buf_.Batch(dy.shape()[0]);
    backend_.Add(da, db, &dx_);
  }
  return dx_;
}

int64_t Residual::ActivationBytesPerSample() const {
  return main_->ActivationBytesPerSample() + shortcut_->ActivationBytesPerSample() +
         4 * (need_dx_ ? 2 : 1) * per_sample_;
}

}  // namespace dptrain
