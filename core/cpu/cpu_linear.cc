// SPDX-License-Identifier: Apache-2.0
// CPU backend: linear layers on oneDNN matmul primitives (three GEMMs), planned once per shape
// and precision and cached.
#include <omp.h>

#include <algorithm>
#include <dnnl.hpp>
#include <exception>
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
  if (omp_get_max_threads() == 2) {
    // The backward matmuls for LinearBackward's two threads, each planned for one: oneDNN fixes
    // a primitive's split over threads when it is created (for omp_get_max_threads() of them),
    // and runs it on the calling thread alone inside a parallel region, so a primitive planned
    // for two would compute only the first thread's share there.
    struct OneThread {
      OneThread() { omp_set_num_threads(1); }
      ~OneThread() { omp_set_num_threads(2); }
    };
    const OneThread one;
    const auto data1 = matmul(dy_in, w_in, memory::desc(), x_user);
    const auto weights1 = matmul(p->w_dy_view, x_in, memory::desc(), w_user);
    p->serial_data = dnnl::primitive(data1);
    p->serial_w = dnnl::primitive(weights1);
    p->serial_data_scratch = data1.scratchpad_desc();
    p->serial_w_scratch = weights1.scratchpad_desc();
    impl_->Reserve(*this, p->serial_data_scratch);
    impl_->ReserveTransient(*this, p->serial_w_scratch.get_size());
  }
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
  const auto& p = static_cast<const LinearPlan&>(plan);
  if (dx == nullptr || !p.serial_data || omp_get_max_threads() != 2) {
    WeightedBackward(plan, p.d.flops(), "linear_bwd_weights", "linear_bwd_data", x, dy, w, dx, dw,
                     db, accumulate);
    return;
  }
  // On two threads, the data and weight gradients side by side, one matmul on each thread:
  // oneDNN 2.6's bf16 matmuls for a classifier's shapes barely gain from a second thread
  // (ref_cnn's fc1 at batch 64: the data gradient 0.150 ms on one, 0.165 on two; the weight
  // gradient 0.143 and 0.136). Timed as one op, both passes' FLOPs.
  OpScope scope(this, "linear_bwd");
  scope.set_flops(2 * p.d.flops());
  Impl& im = *impl_;
  const memory x_in = im.WeightsX(p, x, /*from_forward=*/true);
  const memory dy_in = p.w_dy.In(im.engine, im.stream, dy);
  const memory w_in = im.DataW(p, w, /*from_forward=*/true);
  const memory data_dy = im.DyForData(p, dy, dy_in);
  const Tensor w_out = accumulate ? p.acc_w : *dw;
  const Tensor b_out = accumulate ? p.acc_b : (p.bias ? *db : Tensor());
  const memory dx_mem = p.d_dx.OutMem(im.engine, *dx), dw_mem = p.w_dw.OutMem(im.engine, w_out);
  const memory data_scratch = im.Scratch(p.serial_data_scratch);
  const Tensor w_scratch = im.Transient(
      Shape{static_cast<int64_t>(std::max<size_t>(p.serial_w_scratch.get_size(), 1))}, DType::kU8);
  const memory dy_t(p.w_dy_view, im.engine, dy_in.get_data_handle());
  std::exception_ptr failed[2];
#pragma omp parallel for num_threads(2) schedule(static, 1)
  for (int pass = 0; pass < 2; ++pass) {
    try {
      dnnl::stream st(im.engine);
      if (pass == 0) {
        DPT_DNNL(p.serial_data.execute(st, {{DNNL_ARG_SRC, data_dy},
                                            {DNNL_ARG_WEIGHTS, w_in},
                                            {DNNL_ARG_DST, dx_mem},
                                            {DNNL_ARG_SCRATCHPAD, data_scratch}}));
      } else {
        const memory scratch(p.serial_w_scratch, im.engine, w_scratch.raw());
        DPT_DNNL(p.serial_w.execute(st, {{DNNL_ARG_SRC, dy_t},
                                         {DNNL_ARG_WEIGHTS, x_in},
                                         {DNNL_ARG_DST, dw_mem},
                                         {DNNL_ARG_SCRATCHPAD, scratch}}));
      }
      st.wait();
    } catch (...) {
      failed[pass] = std::current_exception();
    }
  }
  for (const auto& f : failed) {
    if (f) std::rethrow_exception(f);
  }
  p.d_dx.Out(im.engine, im.stream, *dx);
  p.w_dw.Out(im.engine, im.stream, w_out);
  im.FinishWeights(p, dy_in, dy, b_out, dw, db, accumulate);
}

}  // namespace dptrain::cpu
