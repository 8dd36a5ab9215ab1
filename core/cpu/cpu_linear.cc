// SPDX-License-Identifier: Apache-2.0
// CPU backend: linear layers on oneDNN matmul primitives (three GEMMs), planned once per shape
// and precision and cached.
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
  if (slot) return fusions_ ? impl_->Shared(*this, slot) : slot;
  auto p = std::make_shared<LinearPlan>();
  p->d = d;
  p->bias = d.bias;
  const auto& eng = impl_->engine;
  const memory::desc x_user({d.n, d.in}, Dt::f32, Tag::ab), w_user({d.out, d.in}, Dt::f32, Tag::ab),
      y_user({d.n, d.out}, Dt::f32, Tag::ab);
  // The three passes are GEMMs on oneDNN's matmul (brgemm): forward y = x W^T + b, backward data
  // dx = dy W, backward weights dW = dy^T x (the bias gradient: WeightedPlan's column sums). W^T
  // and dy^T are views of the same bytes in "ba" order, so every operand stays in its plain
  // layout: f32 runs on the caller's tensors, bf16 stages x, W and dy once as bf16 (the forward's
  // staged x and W serve the backward passes too) and writes y, dx and dW in f32. oneDNN 2.6's
  // inner product runs the forward GEMM a third slower (ref_cnn's fc1, 32 x 3136 -> 128 on one
  // core: 0.24 ms against 0.16; bf16 0.23 against 0.12), and in bf16 it reorders the weight to
  // its own layout for the backward passes and the weight gradient back (0.45 ms for fc1, three
  // times the GEMMs themselves).
  const Dt ct = ComputeType(d.precision);
  const memory::desc x_in({d.n, d.in}, ct, Tag::ab), w_in({d.out, d.in}, ct, Tag::ab),
      dy_in({d.n, d.out}, ct, Tag::ab);
  p->matmul = p->weights_matmul = true;
  p->b_md = d.bias ? memory::desc({1, d.out}, Dt::f32, Tag::ab) : memory::desc();
  p->fwd_w_view = memory::desc({d.in, d.out}, ct, Tag::ba);
  p->w_dy_view = memory::desc({d.out, d.n}, ct, Tag::ba);
  const auto attr = MakeAttr();
  const auto matmul = [&](const memory::desc& a, const memory::desc& b, const memory::desc& bias,
                          const memory::desc& out) {
    return DPT_DNNL(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias, out), attr, eng));
  };
  const auto fwd = matmul(x_in, p->fwd_w_view, p->b_md, y_user);
  const auto data = matmul(dy_in, w_in, memory::desc(), x_user);
  const auto weights = matmul(p->w_dy_view, x_in, memory::desc(), w_user);
  impl_->Finish(*this, p.get(), "linear", d.precision == Precision::kF16,
                {dnnl::primitive(fwd), x_in, w_in, y_user, fwd.scratchpad_desc()},
                {dnnl::primitive(data), dy_in, w_in, x_user, data.scratchpad_desc()},
                {dnnl::primitive(weights), x_in, dy_in, w_user, weights.scratchpad_desc()}, x_user,
                x_user, w_user, y_user, y_user, Shape{d.out, d.in});
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
