// SPDX-License-Identifier: Apache-2.0
// CPU backend: linear layers on oneDNN inner-product primitives (a GEMM), planned once per
// shape and precision and cached.
#include <dnnl.hpp>
#include <memory>
#include <mutex>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_backend_impl.h"
#include "core/error.h"

namespace dptrain::cpu {

std::shared_ptr<OpPlan> CpuBackend::PrepareLinear(const LinearDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cpu: linear " << d.ToString();
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& slot = impl_->linear[LinearKey(d)];
  if (slot) return slot;
  auto p = std::make_shared<LinearPlan>();
  p->d = d;
  p->bias = d.bias;
  const auto& eng = impl_->engine;
  const memory::desc x_user({d.n, d.in}, Dt::f32, Tag::nc), w_user({d.out, d.in}, Dt::f32, Tag::oi),
      y_user({d.n, d.out}, Dt::f32, Tag::nc);
  // f32 runs on the caller's layouts (a GEMM; nothing to gain from reorders); bf16 stages the
  // operands as bf16 and keeps f32 outputs and weight gradients.
  const bool bf16 = d.precision == Precision::kBF16;
  const memory::desc x_md = bf16 ? memory::desc({d.n, d.in}, Dt::bf16, Tag::any) : x_user;
  const memory::desc w_md = bf16 ? memory::desc({d.out, d.in}, Dt::bf16, Tag::any) : w_user;
  const memory::desc y_md = bf16 ? memory::desc({d.n, d.out}, Dt::bf16, Tag::any) : y_user;
  const memory::desc dw_md = bf16 ? memory::desc({d.out, d.in}, Dt::f32, Tag::any) : w_user;
  p->b_md = d.bias ? memory::desc({d.out}, Dt::f32, Tag::x) : memory::desc();
  const auto attr = MakeAttr();
  const auto fwd = DPT_DNNL(dnnl::inner_product_forward::primitive_desc(
      dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, x_md, w_md, p->b_md,
                                        y_md),
      attr, eng));
  const auto data = DPT_DNNL(dnnl::inner_product_backward_data::primitive_desc(
      dnnl::inner_product_backward_data::desc(x_md, w_md, y_md), attr, eng, fwd));
  const auto weights = DPT_DNNL(dnnl::inner_product_backward_weights::primitive_desc(
      dnnl::inner_product_backward_weights::desc(x_md, dw_md, p->b_md, y_md), attr, eng, fwd));
  impl_->Finish(*this, p.get(), "linear", d.precision == Precision::kF16, fwd, data, weights,
                x_user, w_user, y_user, Shape{d.out, d.in});
  slot = p;
  return p;
}

void CpuBackend::LinearForward(const OpPlan& plan, const Tensor& x, const Tensor& w,
                               const Tensor* b, Tensor* y) {
  OpScope scope(this, "linear_fwd");
  const auto& p = static_cast<const LinearPlan&>(plan);
  scope.set_flops(p.d.flops());
  CheckF32(x, "linear x");
  DPT_CHECK(x.numel() == p.d.n * p.d.in) << x.shape().ToString() << " for " << p.d.ToString();
  DPT_CHECK(!p.d.bias || b != nullptr) << "linear with bias needs a bias tensor";
  impl_->Forward(p, x, w, b, y);
}

void CpuBackend::LinearBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                    Tensor* dx) {
  OpScope scope(this, "linear_bwd_data");
  const auto& p = static_cast<const LinearPlan&>(plan);
  scope.set_flops(p.d.flops());
  impl_->BackwardData(p, dy, w, dx);
}

void CpuBackend::LinearBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                       Tensor* dw, Tensor* db, bool accumulate) {
  OpScope scope(this, "linear_bwd_weights");
  const auto& p = static_cast<const LinearPlan&>(plan);
  scope.set_flops(p.d.flops());
  impl_->BackwardWeights(p, x, dy, dw, db, accumulate);
}

void CpuBackend::LinearBackward(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                const Tensor& w, Tensor* dx, Tensor* dw, Tensor* db,
                                bool accumulate) {
  WeightedBackward(plan, static_cast<const LinearPlan&>(plan).d.flops(), "linear_bwd_weights",
                   "linear_bwd_data", x, dy, w, dx, dw, db, accumulate);
}

}  // namespace dptrain::cpu
