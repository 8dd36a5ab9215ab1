// SPDX-License-Identifier: Apache-2.0
// CUDA backend: max and average pooling on dptrain's own kernels (kernels.cu), NCHW or
// channels-last (PoolDesc::nhwc, and y_nchw: a channels-last x pooled into an NCHW y); max pooling
// records each window's argmax position in the caller's workspace for the backward pass.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/kernels.h"
#include "core/error.h"

namespace dptrain::cuda {
namespace {

struct PoolPlan final : OpPlan {
  PoolDesc d;
  kernels::PoolGeom g{};
  kernels::PoolLayout l{};
};

}  // namespace

std::shared_ptr<OpPlan> CudaBackend::PreparePool(const PoolDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cuda: pool " << d.ToString();
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = pool_plans_[std::make_tuple(static_cast<int>(d.kind), d.n, d.c, d.h, d.w, d.kernel,
                                           d.stride, d.pad, d.ceil_mode, d.count_include_pad,
                                           d.nhwc, d.y_nchw, d.dx_bf16)];
  if (slot) return slot;
  auto p = std::make_shared<PoolPlan>();
  p->d = d;
  p->g = kernels::PoolGeom{d.n * d.c, d.h,      d.w,   d.out_h(),          d.out_w(),
                           d.kernel,  d.stride, d.pad, d.count_include_pad};
  p->l = kernels::PoolLayout{d.c, d.nhwc, d.nhwc && !d.y_nchw};
  p->workspace_bytes =
      d.kind == PoolKind::kMax ? static_cast<size_t>(d.n * d.c * d.out_h() * d.out_w()) * 4 : 0;
  slot = p;
  return p;
}

void CudaBackend::PoolForward(const OpPlan& plan, const Tensor& x, Tensor* y, Tensor* ws) {
  OpScope scope(this, "pool_fwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  CheckF32(x, "pool x");
  CheckF32(*y, "pool y");
  CheckNumel(x, p.d.n * p.d.c * p.d.h * p.d.w, "pool x", p.d);
  CheckNumel(*y, p.d.n * p.d.c * p.d.out_h() * p.d.out_w(), "pool y", p.d);
  if (p.d.kind == PoolKind::kAvg) {
    kernels::AvgPoolForward(p.g, p.l, x.data<float>(), y->data<float>(), stream_);
    return;
  }
  int32_t* argmax = nullptr;
  if (ws != nullptr) {
    CheckDev(*ws, "pool workspace");
    DPT_CHECK(ws->bytes() >= p.workspace_bytes) << "pool workspace too small";
    argmax = ws->data<int32_t>();
  }
  kernels::MaxPoolForward(p.g, p.l, x.data<float>(), y->data<float>(), argmax, stream_);
}

void CudaBackend::PoolBackward(const OpPlan& plan, const Tensor& dy, const Tensor* ws, Tensor* dx) {
  OpScope scope(this, "pool_bwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  CheckF32(dy, "pool dy");
  CheckDev(*dx, "pool dx");
  DPT_CHECK(dx->dtype() == (p.d.dx_bf16 ? DType::kBF16 : DType::kF32))
      << "pool dx: " << DTypeName(dx->dtype()) << " for " << p.d.ToString();
  CheckNumel(dy, p.d.n * p.d.c * p.d.out_h() * p.d.out_w(), "pool dy", p.d);
  CheckNumel(*dx, p.d.n * p.d.c * p.d.h * p.d.w, "pool dx", p.d);
  if (p.d.kind == PoolKind::kAvg) {
    kernels::AvgPoolBackward(p.g, p.l, dy.data<float>(), dx->data<float>(), stream_);
    return;
  }
  DPT_CHECK(ws != nullptr) << "max-pool backward needs the forward workspace";
  CheckDev(*ws, "pool workspace");
  DPT_CHECK(ws->bytes() >= p.workspace_bytes) << "pool workspace too small";
  kernels::MaxPoolBackward(p.g, p.l, dy.data<float>(), ws->data<int32_t>(), dx->raw(), p.d.dx_bf16,
                           stream_);
}

}  // namespace dptrain::cuda
