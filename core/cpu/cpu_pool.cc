// SPDX-License-Identifier: Apache-2.0
// CPU backend: max and average pooling on oneDNN pooling primitives, planned once per shape and
// cached; max pooling keeps its argmax in the caller's workspace.
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_backend_impl.h"
#include "core/error.h"

namespace dptrain::cpu {

std::shared_ptr<OpPlan> CpuBackend::PreparePool(const PoolDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cpu: pool " << d.ToString();
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& slot = impl_->pool[PoolKey(d)];
  if (slot) return slot;
  auto p = std::make_shared<PoolPlan>();
  p->d = d;
  p->x_md = memory::desc({d.n, d.c, d.h, d.w}, Dt::f32, Tag::nchw);
  p->y_md = memory::desc({d.n, d.c, d.out_h(), d.out_w()}, Dt::f32, Tag::nchw);
  const memory::dims strides{d.stride, d.stride}, kernel{d.kernel, d.kernel}, pad{d.pad, d.pad};
  // PyTorch's AvgPool2d counts padded zeros (count_include_pad=True); MaxPool2d pads with -inf.
  const auto alg = d.kind == PoolKind::kMax ? dnnl::algorithm::pooling_max
                                            : dnnl::algorithm::pooling_avg_include_padding;
  const auto attr = MakeAttr();
  p->train_pd = DPT_DNNL(dnnl::pooling_forward::primitive_desc(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, p->x_md, p->y_md, strides,
                                  kernel, pad, pad),
      attr, impl_->engine));
  p->infer_pd = DPT_DNNL(dnnl::pooling_forward::primitive_desc(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_inference, alg, p->x_md, p->y_md,
                                  strides, kernel, pad, pad),
      attr, impl_->engine));
  p->bwd_pd = DPT_DNNL(dnnl::pooling_backward::primitive_desc(
      dnnl::pooling_backward::desc(alg, p->x_md, p->y_md, strides, kernel, pad, pad), attr,
      impl_->engine, p->train_pd));
  p->train = dnnl::pooling_forward(p->train_pd);
  p->infer = dnnl::pooling_forward(p->infer_pd);
  p->bwd = dnnl::pooling_backward(p->bwd_pd);
  p->workspace_bytes = d.kind == PoolKind::kMax ? p->train_pd.workspace_desc().get_size() : 0;
  impl_->Reserve(*this, p->train_pd.scratchpad_desc());
  impl_->Reserve(*this, p->infer_pd.scratchpad_desc());
  impl_->Reserve(*this, p->bwd_pd.scratchpad_desc());
  slot = p;
  return p;
}

void CpuBackend::PoolForward(const OpPlan& plan, const Tensor& x, Tensor* y, Tensor* ws) {
  OpScope scope(this, "pool_fwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  CheckF32(x, "pool x");
  DPT_CHECK(x.numel() == p.d.n * p.d.c * p.d.h * p.d.w)
      << x.shape().ToString() << " for " << p.d.ToString();
  const bool training = ws != nullptr || p.d.kind == PoolKind::kAvg;
  const auto& pd = training ? p.train_pd : p.infer_pd;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, impl_->Mem(p.x_md, x)},
                                       {DNNL_ARG_DST, impl_->Mem(p.y_md, *y)},
                                       {DNNL_ARG_SCRATCHPAD, impl_->Scratch(pd.scratchpad_desc())}};
  if (p.d.kind == PoolKind::kMax && ws != nullptr) {
    DPT_CHECK(ws->bytes() >= p.workspace_bytes) << "pool workspace too small";
    args.emplace(DNNL_ARG_WORKSPACE, impl_->Mem(p.train_pd.workspace_desc(), *ws));
  }
  DPT_DNNL((training ? p.train : p.infer).execute(impl_->stream, args));
}

void CpuBackend::PoolBackward(const OpPlan& plan, const Tensor& dy, const Tensor* ws, Tensor* dx) {
  OpScope scope(this, "pool_bwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_DIFF_DST, impl_->Mem(p.y_md, dy)},
      {DNNL_ARG_DIFF_SRC, impl_->Mem(p.x_md, *dx)},
      {DNNL_ARG_SCRATCHPAD, impl_->Scratch(p.bwd_pd.scratchpad_desc())}};
  if (p.d.kind == PoolKind::kMax) {
    DPT_CHECK(ws != nullptr) << "max-pool backward needs the forward workspace";
    args.emplace(DNNL_ARG_WORKSPACE, impl_->Mem(p.train_pd.workspace_desc(), *ws));
  }
  DPT_DNNL(p.bwd.execute(impl_->stream, args));
}

}  // namespace dptrain::cpu
