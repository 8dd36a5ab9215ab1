// SPDX-License-Identifier: Apache-2.0
// CPU backend: max pooling on oneDNN pooling primitives (planned once per shape and cached, the
// argmax kept in the caller's workspace); average pooling on loops over the window arithmetic
// of core/pool_window.h, which the CUDA kernels share.
#include <algorithm>
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
  p->g = ew::PoolGeom{d.n * d.c, d.h,      d.w,   d.out_h(),          d.out_w(),
                      d.kernel,  d.stride, d.pad, d.count_include_pad};
  if (d.kind == PoolKind::kAvg) {
    slot = p;
    return p;
  }
  const Tag tag = d.nhwc ? Tag::nhwc : Tag::nchw;
  p->x_md = memory::desc({d.n, d.c, d.h, d.w}, Dt::f32, tag);
  p->y_md = memory::desc({d.n, d.c, d.out_h(), d.out_w()}, Dt::f32, tag);
  // oneDNN derives the output size from the padding: in ceil mode the right/bottom padding
  // grows to cover the last window (padded with -inf, so it never wins).
  const auto pad_r = [&](int64_t in, int64_t out) {
    return std::max<int64_t>(d.pad, (out - 1) * d.stride + d.kernel - in - d.pad);
  };
  const memory::dims strides{d.stride, d.stride}, kernel{d.kernel, d.kernel}, pad_l{d.pad, d.pad},
      pad_rb{pad_r(d.h, d.out_h()), pad_r(d.w, d.out_w())};
  const auto alg = dnnl::algorithm::pooling_max;
  const auto attr = MakeAttr();
  p->train_pd = DPT_DNNL(dnnl::pooling_forward::primitive_desc(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, p->x_md, p->y_md, strides,
                                  kernel, pad_l, pad_rb),
      attr, impl_->engine));
  p->infer_pd = DPT_DNNL(dnnl::pooling_forward::primitive_desc(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_inference, alg, p->x_md, p->y_md,
                                  strides, kernel, pad_l, pad_rb),
      attr, impl_->engine));
  // dx in bf16 (dx_bf16): oneDNN's bf16 backward wants dy in bf16 too, and reads the f32
  // forward's workspace (the window position of each maximum, one byte each).
  const memory::desc dx_md = d.dx_bf16 ? memory::desc(p->x_md.dims(), Dt::bf16, tag) : p->x_md;
  const memory::desc dy_md = d.dx_bf16 ? memory::desc(p->y_md.dims(), Dt::bf16, tag) : p->y_md;
  p->bwd_pd = DPT_DNNL(dnnl::pooling_backward::primitive_desc(
      dnnl::pooling_backward::desc(alg, dx_md, dy_md, strides, kernel, pad_l, pad_rb), attr,
      impl_->engine, p->train_pd));
  DPT_CHECK(p->bwd_pd.workspace_desc() == p->train_pd.workspace_desc())
      << "oneDNN's bf16 max-pool backward reads another workspace than its f32 forward writes";
  if (d.dx_bf16) {
    p->dy_bf16 = Empty(Shape{static_cast<int64_t>(dy_md.get_size())}, DType::kU8, "pool dy (bf16)");
    p->dy_to_bf16 = dnnl::reorder(memory(p->y_md, impl_->engine, nullptr),
                                  memory(dy_md, impl_->engine, nullptr));
    p->held_bytes = p->dy_bf16.bytes();
  }
  p->train = dnnl::pooling_forward(p->train_pd);
  p->infer = dnnl::pooling_forward(p->infer_pd);
  p->bwd = dnnl::pooling_backward(p->bwd_pd);
  p->workspace_bytes = p->train_pd.workspace_desc().get_size();
  impl_->Reserve(*this, p->train_pd.scratchpad_desc());
  impl_->Reserve(*this, p->infer_pd.scratchpad_desc());
  impl_->Reserve(*this, p->bwd_pd.scratchpad_desc());
  slot = p;
  return p;
}

void CpuBackend::PoolForward(const OpPlan& plan, const Tensor& x, Tensor* y, Tensor* ws) {
  OpScope scope(this, "pool_fwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  const ew::PoolGeom& g = p.g;
  CheckF32(x, "pool x");
  DPT_CHECK(x.numel() == g.planes * g.h * g.w) << x.shape().ToString() << " for " << p.d.ToString();
  DPT_CHECK(y->numel() == g.planes * g.p * g.q)
      << y->shape().ToString() << " for " << p.d.ToString();
  if (p.d.kind == PoolKind::kAvg) {
    const float* in = x.data<float>();
    float* out = y->data<float>();
    const int64_t n = g.planes * g.p * g.q;
    if (p.d.nhwc) {  // output o = ((i * P + oh) * Q + ow) * C + c
      const int64_t c = p.d.c;
#pragma omp parallel for if (n * g.kernel * g.kernel > kParallelMin)
      for (int64_t o = 0; o < n; ++o) {
        const int64_t pix = o / c, i = pix / (g.p * g.q), rem = pix % (g.p * g.q);
        out[o] = ew::AvgPoolAt(g, in + i * g.h * g.w * c + o % c, rem / g.q, rem % g.q, c);
      }
      return;
    }
#pragma omp parallel for if (n * g.kernel * g.kernel > kParallelMin)
    for (int64_t o = 0; o < n; ++o) {
      const int64_t plane = o / (g.p * g.q), rem = o % (g.p * g.q);
      out[o] = ew::AvgPoolAt(g, in + plane * g.h * g.w, rem / g.q, rem % g.q);
    }
    return;
  }
  const bool training = ws != nullptr;
  const auto& pd = training ? p.train_pd : p.infer_pd;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, impl_->Mem(p.x_md, x)},
                                       {DNNL_ARG_DST, impl_->Mem(p.y_md, *y)},
                                       {DNNL_ARG_SCRATCHPAD, impl_->Scratch(pd.scratchpad_desc())}};
  if (training) {
    DPT_CHECK(ws->bytes() >= p.workspace_bytes) << "pool workspace too small";
    args.emplace(DNNL_ARG_WORKSPACE, impl_->Mem(p.train_pd.workspace_desc(), *ws));
  }
  DPT_DNNL((training ? p.train : p.infer).execute(impl_->stream, args));
}

void CpuBackend::PoolBackward(const OpPlan& plan, const Tensor& dy, const Tensor* ws, Tensor* dx) {
  OpScope scope(this, "pool_bwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  const ew::PoolGeom& g = p.g;
  CheckF32(dy, "pool dy");
  DPT_CHECK(dy.numel() == g.planes * g.p * g.q && dx->numel() == g.planes * g.h * g.w)
      << "pool backward: dy " << dy.shape().ToString() << ", dx " << dx->shape().ToString()
      << " for " << p.d.ToString();
  if (p.d.kind == PoolKind::kAvg) {
    const float* gy = dy.data<float>();
    float* out = dx->data<float>();
    const int64_t n = g.planes * g.h * g.w;
    if (g.p == 1 && g.q == 1 && g.pad == 0 && g.kernel == g.h && g.kernel == g.w) {
      // Global pooling (ResNet's head): one window per plane, the same value everywhere in it;
      // what the general loops below compute without their window search per element. dy is
      // (N, C, 1, 1): one layout in NCHW and NHWC.
      const float divisor = ew::WindowOf(g, 0, 0).divisor;
      if (p.d.nhwc) {
        const int64_t c = p.d.c, hw = g.h * g.w;
#pragma omp parallel for if (n > kParallelMin)
        for (int64_t e = 0; e < n / c; ++e) {
          const float* src = gy + (e / hw) * c;
          for (int64_t j = 0; j < c; ++j) out[e * c + j] = src[j] / divisor;
        }
        return;
      }
#pragma omp parallel for if (n > kParallelMin)
      for (int64_t plane = 0; plane < g.planes; ++plane) {
        std::fill_n(out + plane * g.h * g.w, g.h * g.w, gy[plane] / divisor);
      }
      return;
    }
    if (p.d.nhwc) {  // input e = ((i * H + ih) * W + iw) * C + c
      const int64_t c = p.d.c;
#pragma omp parallel for if (n > kParallelMin)
      for (int64_t e = 0; e < n; ++e) {
        const int64_t pix = e / c, i = pix / (g.h * g.w), pos = pix % (g.h * g.w);
        out[e] = ew::AvgPoolGradAt(g, gy + i * g.p * g.q * c + e % c, pos / g.w, pos % g.w, c);
      }
      return;
    }
#pragma omp parallel for if (n > kParallelMin)
    for (int64_t e = 0; e < n; ++e) {
      const int64_t plane = e / (g.h * g.w), pos = e % (g.h * g.w);
      out[e] = ew::AvgPoolGradAt(g, gy + plane * g.p * g.q, pos / g.w, pos % g.w);
    }
    return;
  }
  DPT_CHECK(ws != nullptr) << "max-pool backward needs the forward workspace";
  DPT_CHECK(dx->dtype() == (p.d.dx_bf16 ? DType::kBF16 : DType::kF32))
      << "pool dx: " << DTypeName(dx->dtype()) << " for " << p.d.ToString();
  memory dy_mem = impl_->Mem(p.y_md, dy);
  if (p.d.dx_bf16) {
    memory staged(p.bwd_pd.diff_dst_desc(), impl_->engine, p.dy_bf16.raw());
    DPT_DNNL(p.dy_to_bf16.execute(impl_->stream, dy_mem, staged));
    dy_mem = staged;
  }
  std::unordered_map<int, memory> args{
      {DNNL_ARG_DIFF_DST, dy_mem},
      {DNNL_ARG_DIFF_SRC, impl_->Mem(p.bwd_pd.diff_src_desc(), *dx)},
      {DNNL_ARG_SCRATCHPAD, impl_->Scratch(p.bwd_pd.scratchpad_desc())},
      {DNNL_ARG_WORKSPACE, impl_->Mem(p.train_pd.workspace_desc(), *ws)}};
  DPT_DNNL(p.bwd.execute(impl_->stream, args));
}

}  // namespace dptrain::cpu
