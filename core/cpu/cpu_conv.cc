// SPDX-License-Identifier: Apache-2.0
// CPU backend: conv2d on oneDNN convolution primitives (forward, backward data, backward
// weights), planned once per shape and precision and cached.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_backend_impl.h"
#include "core/error.h"

namespace dptrain::cpu {

std::shared_ptr<OpPlan> CpuBackend::PrepareConv2d(const Conv2dDesc& desc) {
  if (!Supports(desc)) DPT_THROW(UnsupportedError) << "cpu: conv2d " << desc.ToString();
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& slot = impl_->conv[ConvKey(desc)];
  if (slot) return fusions_ ? impl_->Shared(*this, slot) : slot;
  auto p = std::make_shared<ConvPlan>();
  p->d = desc;
  p->bias = desc.bias;
  p->gemm = PlansGemm(desc);
  p->subsample = PlansSubsample(desc);
  // the weight gradient on AMX tiles where it runs so, else unfolded where it unfolds
  p->tiles = fusions_ && !p->gemm && !p->subsample && TilesWeightGradient(desc);
  p->unfold = UnfoldsWeightGradient(desc) && !p->tiles;
  p->blocked_weights = fusions_ && !p->unfold && !p->tiles && BlocksWeightGradient(desc);
  // The convolution the primitives run: with `subsample`, the stride-1 1x1 one over x's every
  // stride-th pixel of every stride-th row (the staging of x picks them out, ConvPlan).
  Conv2dDesc d = desc;
  if (p->subsample) {
    d.h = desc.out_h();
    d.w = desc.out_w();
    d.stride = 1;
  }
  const auto& eng = impl_->engine;
  // oneDNN counts dilation from 0 (0 = dense). A grouped weight is (G, K/G, C/G, R, S) in goihw,
  // which is PyTorch's (K, C/G, R, S) in memory.
  const memory::dims strides{d.stride, d.stride}, pad{d.pad, d.pad},
      dilates{d.dilation - 1, d.dilation - 1};
  const memory::dims xs{d.n, d.c, d.h, d.w}, ys{d.n, d.k, d.out_h(), d.out_w()};
  const memory::dims ws = d.groups == 1
                              ? memory::dims{d.k, d.c, d.r, d.s}
                              : memory::dims{d.groups, d.k / d.groups, d.group_c(), d.r, d.s};
  // x as the caller hands it: with `subsample`, a strided view of the (N, H, W, C) tensor.
  const auto x_view = [&](Dt dt) {
    if (!p->subsample) return memory::desc(xs, dt, d.x_nhwc ? Tag::nhwc : Tag::nchw);
    const int64_t s = desc.stride, c = desc.c;
    return memory::desc(xs, dt, memory::dims{desc.h * desc.w * c, 1, s * desc.w * c, s * c});
  };
  const memory::desc x_user = x_view(Dt::f32),
                     dx_user(xs, Dt::f32, d.x_nhwc ? Tag::nhwc : Tag::nchw),
                     w_user(ws, Dt::f32, d.groups == 1 ? Tag::oihw : Tag::goihw),
                     y_user(ys, d.y_bf16 ? Dt::bf16 : Dt::f32, d.y_nhwc ? Tag::nhwc : Tag::nchw);
  // The forward's y: f32, or bf16 (Conv2dDesc::y_bf16); the backward passes never read it.
  const Dt yt = d.y_bf16 ? Dt::bf16 : Dt::f32;
  p->b_md = d.bias ? memory::desc({d.k}, Dt::f32, Tag::x) : memory::desc();
  // A folded ReLU is a post-op of the forward primitive: applied to the f32 accumulator after the
  // bias, before the output is converted or reordered (max(v, 0) rounds as v does, so this is
  // bit for bit the convolution then the ReLU). Backward is the plain convolution's.
  auto fwd_attr = MakeAttr();
  if (d.relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    fwd_attr.set_post_ops(ops);
  }
  // bf16 runs the convolution on bf16 data with f32 accumulation and f32 weight gradients.
  // Activations: with NCHW on both sides, oneDNN picks its fastest (blocked) layouts and we
  // reorder at the edges. With channels-last activations the primitives read and write NHWC
  // themselves (as fast here as the blocked kernels, and no reorder: ~15% of a ResNet-8 step),
  // unless oneDNN has only its reference kernel for NHWC at this shape.
  const Dt ct = ComputeType(d.precision);
  const memory::desc w_any(ws, ct, Tag::any), dw_any(ws, Dt::f32, Tag::any);
  const auto attr = MakeAttr();
  // The results (y, dx) come out in f32 whatever the precision: a bf16 convolution writes its
  // f32 accumulators without rounding them to bf16, and no conversion pass follows.
  using Pass = Impl::PassPrimitive;
  // x as the caller hands it (Conv2dDesc::x_bf16); dx is f32 either way.
  const memory::desc x_given = d.x_bf16 ? x_view(Dt::bf16) : x_user;
  const memory::desc dy_user(ys, d.dy_bf16 ? Dt::bf16 : Dt::f32, d.y_nhwc ? Tag::nhwc : Tag::nchw);
  const int64_t rows = d.n * d.out_h() * d.out_w(), taps = d.r * d.s * d.c;
  size_t transient = 0;  // the bytes of Impl::transient the passes use
  Pass fwd_pass, data_pass, weights_pass;
  if (p->gemm) {
    // y (rows, K) = cols (rows, taps) W^T (+ b, ReLU) and dcols (rows, taps) = dy (rows, K) W on
    // oneDNN's matmul, W staged OHWI in bf16 once for both (K x taps, read as its transpose by
    // the forward), dy staged channels-last in bf16 (or read as the caller's bf16 dy).
    const memory::desc w_ohwi(ws, Dt::bf16, Tag::acdb), dy_nhwc(ys, Dt::bf16, Tag::nhwc);
    p->cols_md = memory::desc({rows, taps}, Dt::bf16, Tag::ab);
    p->dcols_md = memory::desc({rows, taps}, Dt::f32, Tag::ab);
    p->fwd_w_view = memory::desc({taps, d.k}, Dt::bf16, Tag::ba);
    p->fwd_y_view = memory::desc({rows, d.k}, yt, Tag::ab);
    p->data_dy_view = memory::desc({rows, d.k}, Dt::bf16, Tag::ab);
    p->data_w_view = memory::desc({d.k, taps}, Dt::bf16, Tag::ab);
    p->b_md = d.bias ? memory::desc({1, d.k}, Dt::f32, Tag::ab) : memory::desc();
    const auto fwd = DPT_DNNL(dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(p->cols_md, p->fwd_w_view, p->b_md, p->fwd_y_view), fwd_attr, eng));
    const auto data = DPT_DNNL(dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(p->data_dy_view, p->data_w_view, p->dcols_md), attr, eng));
    fwd_pass = {dnnl::primitive(fwd), x_given, w_ohwi, y_user, fwd.scratchpad_desc()};
    data_pass = {dnnl::primitive(data), dy_nhwc, w_ohwi, dx_user, data.scratchpad_desc()};
    transient = p->dcols_md.get_size();
  } else {
    // The weight gradient's x and dy: the activations' layout, or with `blocked_weights` the
    // one oneDNN picks (its blocked layout: x and dy are staged into it).
    const auto plan = [&](dnnl::algorithm alg, Tag act, Tag fwd_act) {
      const Tag w_act = p->blocked_weights ? Tag::any : act;
      const memory::desc x_in(xs, ct, w_act), y_in(ys, ct, act), x_out(xs, Dt::f32, act),
          y_out(ys, Dt::f32, act), x_fwd(xs, ct, fwd_act), y_fwd(ys, yt, fwd_act),
          dy_w(ys, ct, w_act);
      auto fwd = DPT_DNNL(dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x_fwd, w_any,
                                          p->b_md, y_fwd, strides, dilates, pad, pad),
          fwd_attr, eng));
      auto data = DPT_DNNL(dnnl::convolution_backward_data::primitive_desc(
          dnnl::convolution_backward_data::desc(alg, x_out, w_any, y_in, strides, dilates, pad,
                                                pad),
          attr, eng, fwd));
      auto weights = DPT_DNNL(dnnl::convolution_backward_weights::primitive_desc(
          dnnl::convolution_backward_weights::desc(alg, x_in, dw_any, p->b_md, dy_w, strides,
                                                   dilates, pad, pad),
          attr, eng, fwd));
      return std::make_tuple(fwd, data, weights);
    };
    const auto is_ref = [](const auto& pd) {
      return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
    };
    // oneDNN's NHWC forward kernel (brgconv) splits its work along the output rows: an output 4
    // wide leaves it idle most of the time (ResNet-18's last stage at 32x32 input, 512 channels at
    // 4x4, batch 64, 2 threads: 16.1 ms fp32 and 6.3 ms bf16, where the blocked kernel takes 9.8
    // and 3.7). There the forward alone runs on blocked layouts, staged in and out (a 2 MB
    // activation), and the backward passes stay on NHWC (as fast or faster there). At 7 or 8
    // wide NHWC is as fast or faster in all three passes.
    const bool nhwc = d.x_nhwc || d.y_nhwc;
    const Tag act = nhwc ? Tag::nhwc : Tag::any;
    const auto direct = dnnl::algorithm::convolution_direct;
    decltype(plan(direct, act, act)) planned;
    bool wino = false;
    if (impl_->winograd && WinogradApplies(d)) {
      // Winograd (train.winograd) on oneDNN's blocked layouts: channels-last activations are
      // reordered at the edges, which the 2x on the convolution more than pays for (ResNet-18 at
      // 32x32, batch 64, 2 threads: 93-98 -> 122-147 samples/s). Where oneDNN has no Winograd
      // kernel (no AVX-512 on this CPU) it refuses the descriptor: direct, as without the option.
      try {
        planned = plan(dnnl::algorithm::convolution_winograd, Tag::any, Tag::any);
        wino = true;
        impl_->winograd_planned = true;  // before Finish allocates its buffers (and may run out)
      } catch (const DnnlError&) {
      }
    }
    if (!wino) {
      planned = plan(direct, act, nhwc && d.out_w() <= 4 ? Tag::any : act);
      // (an unfolded weight gradient runs on a GEMM: its convolution kernel does not count)
      if (is_ref(std::get<0>(planned)) || is_ref(std::get<1>(planned)) ||
          (!p->unfold && !p->tiles && is_ref(std::get<2>(planned)))) {
        planned = plan(direct, Tag::any, Tag::any);
      }
    }
    auto& [fwd, data, weights] = planned;
    p->winograd = wino;
    if (!wino && fusions_ && FlipsBackwardData(d)) {
      // dx = dy convolved (stride 1) with w transposed and rotated, padded by R - 1 - pad: the
      // output is H x W again. oneDNN 2.6 on an AVX-512 Xeon, batch 64, 2 threads, against its
      // backward-data kernels: ref_cnn's conv2 (32 -> 64, 14x14) 1.24 -> 1.03 ms in fp32, ResNet
      // 3x3 stages 1.03-1.18x faster in fp32 and 1.02-1.38x in bf16, 1x1 convolutions 1.01-1.05x
      // in fp32 and 1.2-2.1x in bf16; at 4x4 in fp32 (512 channels) 0.62x, hence fp32 only where
      // dx is wider than 4. A descriptor oneDNN refuses leaves the backward-data kernel.
      const memory::desc dy_in(ys, ct, Tag::nhwc), dx_out(xs, Dt::f32, Tag::nhwc),
          wt_any({d.c, d.k, d.r, d.s}, ct, Tag::any);
      const memory::dims flip_pad{d.r - 1 - d.pad, d.s - 1 - d.pad};
      try {
        auto flipped = DPT_DNNL(dnnl::convolution_forward::primitive_desc(
            dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, direct, dy_in,
                                            wt_any, dx_out, {1, 1}, {0, 0}, flip_pad, flip_pad),
            attr, eng));
        if (std::string(flipped.impl_info_str()).rfind("brgconv", 0) == 0) {
          data_pass = Pass::Forward(flipped);
          data_pass.b_user = memory::desc({d.c, d.k, d.r, d.s}, Dt::f32, Tag::oihw);
          p->data_flip = true;
          p->w_flip = Empty(Shape{d.c, d.k, d.r, d.s}, DType::kF32, "conv2d flipped weight");
        }
      } catch (const DnnlError&) {
      }
    }
    if (!wino && fusions_ && PhasesBackwardData(d)) {
      // dx by phases (ConvPlan::phases) where oneDNN runs all four on brgemm kernels, else its
      // backward-data kernel.
      std::vector<ConvPlan::Phase> phases;
      try {
        for (int64_t k = 0; k < 4; ++k) {
          const int64_t pi = k / 2, pj = k % 2;
          const memory::dims phase_dims{d.c, d.k, pi + 1, pj + 1};
          const memory::desc dy_in(ys, Dt::bf16, Tag::nhwc),
              out({d.n, d.c, d.out_h(), d.out_w()}, Dt::f32, Tag::nhwc);
          auto pd = DPT_DNNL(dnnl::convolution_forward::primitive_desc(
              dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, direct, dy_in,
                                              memory::desc(phase_dims, Dt::bf16, Tag::any), out,
                                              {1, 1}, {0, 0}, {pi, pj}),
              attr, eng));
          if (std::string(pd.impl_info_str()).rfind("brgconv", 0) != 0) break;
          ConvPlan::Phase ph;
          ph.prim = dnnl::primitive(pd);
          ph.w_user = memory::desc(phase_dims, Dt::f32, Tag::oihw);
          ph.w_md = pd.weights_desc();
          ph.out_md = out;
          ph.scratch = pd.scratchpad_desc();
          ph.w_reorder =
              dnnl::reorder(memory(ph.w_user, eng, nullptr), memory(ph.w_md, eng, nullptr));
          phases.push_back(std::move(ph));
        }
      } catch (const DnnlError&) {
        phases.clear();
      }
      if (phases.size() == 4) {
        p->phases = std::move(phases);
        for (auto& ph : p->phases) {
          ph.w = Empty(Shape{static_cast<int64_t>(ph.w_md.get_size())}, DType::kU8,
                       "conv2d phase weight");
          impl_->Reserve(*this, ph.scratch);
        }
        p->phase_taps = Empty(Shape{d.c * d.k * 4}, DType::kF32, "conv2d phase taps");
        transient = static_cast<size_t>(d.n * d.c * d.h * d.w / 2) * sizeof(float);
        // the pass as Finish stages for it: dy in bf16 channels-last, w and dx as the caller's
        data_pass = {p->phases[0].prim, memory::desc(ys, Dt::bf16, Tag::nhwc), w_user, dx_user,
                     memory::desc()};
      }
    }
    // Only the primitives that run are made (each is a JIT-compiled kernel).
    if (!p->data_flip && p->phases.empty()) data_pass = Pass::Data(data);
    fwd_pass = Pass::Forward(fwd);
    if (p->tiles) {
      // TileWeightGradient reads the caller's x and dy: nothing is staged for it
      weights_pass = {dnnl::primitive(), x_given, dy_user, w_user, memory::desc()};
      p->tile_threads = omp_get_max_threads();
      transient = std::max(transient, TileScratchBytes(d, p->tile_threads));
    } else if (!p->unfold) {
      weights_pass = Pass::Weights(weights);
    }
  }
  if (p->unfold) {
    // dW (K, R*S*C) = dy^T (K, N*OH*OW) x cols (N*OH*OW, R*S*C) on oneDNN's matmul, dy staged
    // K-major in bf16 ("bacd"), dW written OHWI and reordered to the caller's OIHW.
    p->cols_md = memory::desc({rows, taps}, Dt::bf16, Tag::ab);
    p->w_dy_view = memory::desc({d.k, rows}, Dt::bf16, Tag::ab);
    p->w_dw_view = memory::desc({d.k, taps}, Dt::f32, Tag::ab);
    p->weights_matmul = true;
    const auto mm = DPT_DNNL(dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(p->w_dy_view, p->cols_md, p->w_dw_view), attr, eng));
    weights_pass = {dnnl::primitive(mm), x_given, memory::desc(ys, Dt::bf16, Tag::bacd),
                    memory::desc(ws, Dt::f32, Tag::acdb), mm.scratchpad_desc()};
    if (p->gemm) {  // the forward's columns, read again by the weight gradient
      p->cols = Empty(Shape{rows * taps}, DType::kBF16, "conv2d unfolded input");
    } else {
      transient = std::max(transient, p->cols_md.get_size());
    }
  }
  impl_->Finish(*this, p.get(), "conv2d", d.precision == Precision::kF16, fwd_pass, data_pass,
                weights_pass, x_given, dx_user, w_user, y_user, dy_user,
                Shape{d.k, d.group_c(), d.r, d.s});
  if (p->subsample && !desc.dx_sub) {  // else the caller's dx is dx_sub
    p->dx_sub = Shape{d.n, d.c, d.h, d.w};
    transient = std::max(transient, static_cast<size_t>(p->dx_sub.numel()) * sizeof(float));
  }
  // once, at the largest of its uses (a smaller buffer first would be held next to the larger)
  if (transient > 0) impl_->ReserveTransient(*this, transient);
  if (p->tiles) {  // TileWeightGradient accumulates into dw itself
    p->held_bytes -= p->acc_w.bytes() + (p->acc_b.defined() ? p->acc_b.bytes() : 0);
    p->acc_w = Tensor();
    p->acc_b = Tensor();
  }
  p->held_bytes += p->cols.defined() ? p->cols.bytes() : 0;
  for (const auto& ph : p->phases) p->held_bytes += ph.w.bytes();
  p->held_bytes += p->phase_taps.defined() ? p->phase_taps.bytes() : 0;
  slot = p;
  return p;
}

bool CpuBackend::WinogradApplies(const Conv2dDesc& d) {
  return d.precision == Precision::kF32 && d.groups == 1 && d.r == 3 && d.s == 3 && d.stride == 1 &&
         d.dilation == 1 && d.c >= 32 && d.k >= 32;
}

std::string CpuBackend::WinogradProblem(Precision p) const {
  if (p != Precision::kF32) {
    return std::string("it applies to fp32 convolutions only, and train.precision is ") +
           (p == Precision::kBF16 ? "bf16" : "fp16");
  }
  // One small forward descriptor, once per process: oneDNN refuses it without a kernel for the
  // CPU (AVX-512), or when DNNL_MAX_CPU_ISA caps the instruction set below that.
  static const bool available = [] {
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const memory::dims x{1, 32, 8, 8}, w{32, 32, 3, 3};
    try {
      (void)dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(
              dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_winograd,
              memory::desc(x, Dt::f32, Tag::any), memory::desc(w, Dt::f32, Tag::any),
              memory::desc(x, Dt::f32, Tag::any), {1, 1}, {1, 1}, {1, 1}),
          eng);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available ? "" : "oneDNN has no Winograd kernel for this CPU (it needs AVX-512)";
}

bool CpuBackend::WinogradPlanned() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->winograd_planned;
}

bool CpuBackend::PlannedWinograd(const OpPlan& plan) {
  const auto* p = dynamic_cast<const ConvPlan*>(&plan);
  return p != nullptr && p->winograd;
}

bool CpuBackend::FlipsBackwardData(const Conv2dDesc& d) {
  return d.groups == 1 && d.stride == 1 && d.dilation == 1 && d.pad <= d.r - 1 &&
         d.pad <= d.s - 1 && d.x_nhwc && d.y_nhwc &&
         (d.precision == Precision::kBF16 || (d.precision == Precision::kF32 && d.w > 4));
}

bool CpuBackend::BlocksWeightGradient(const Conv2dDesc& d) {
  return d.precision == Precision::kF32 && d.r == 3 && d.s == 3 && d.groups == 1 && d.stride == 1 &&
         d.dilation == 1 && d.x_nhwc && d.y_nhwc && d.c >= 32 && d.k >= 2 * d.c && d.out_w() >= 14;
}

bool CpuBackend::PlannedBlockedWeightGradient(const OpPlan& plan) {
  const auto* p = dynamic_cast<const ConvPlan*>(&plan);
  return p != nullptr && p->blocked_weights;
}

bool CpuBackend::PlannedFlip(const OpPlan& plan) {
  const auto* p = dynamic_cast<const ConvPlan*>(&plan);
  return p != nullptr && p->data_flip;
}

void FlipKernel(const Tensor& w, const Tensor& out) {
  const int64_t k = w.shape()[0], c = w.shape()[1], taps = w.shape()[2] * w.shape()[3];
  DPT_CHECK(out.numel() == w.numel())
      << "flipped kernel " << out.shape().ToString() << " for " << w.shape().ToString();
  const float* in = w.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for if (w.numel() > kParallelMin)
  for (int64_t ci = 0; ci < c; ++ci) {
    for (int64_t ki = 0; ki < k; ++ki) {
      const float* src = in + (ki * c + ci) * taps;
      float* dst = o + (ci * k + ki) * taps;
      for (int64_t t = 0; t < taps; ++t) dst[t] = src[taps - 1 - t];
    }
  }
}

bool CpuBackend::PhasesBackwardData(const Conv2dDesc& d) {
  return d.precision == Precision::kBF16 && d.groups == 1 && d.dilation == 1 && d.r == 3 &&
         d.s == 3 && d.stride == 2 && d.pad == 1 && d.h % 2 == 0 && d.w % 2 == 0 && d.c >= 32 &&
         d.x_nhwc && d.y_nhwc;
}

bool CpuBackend::PlannedPhases(const OpPlan& plan) {
  const auto* p = dynamic_cast<const ConvPlan*>(&plan);
  return p != nullptr && !p->phases.empty();
}

namespace {
// One row of dx (w pixels of c channels) from the rows of its two phases: even columns from a,
// odd ones from b.
DPT_SIMD_CLONES void InterleaveRow(const float* a, const float* b, float* dx, int64_t w,
                                   int64_t c) {
  for (int64_t q = 0; q < w / 2; ++q, a += c, b += c, dx += 2 * c) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) dx[i] = a[i];
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) dx[c + i] = b[i];
  }
}
}  // namespace

void Interleave(const ConvPlan& p, const Tensor& parts, int64_t pi, const Tensor& dx) {
  const Conv2dDesc& d = p.d;
  const int64_t oh = d.h / 2, ow = d.w / 2, part = d.n * oh * ow * d.c;
  DPT_CHECK(dx.dtype() == DType::kF32 && dx.numel() == d.n * d.c * d.h * d.w &&
            parts.numel() >= 2 * part)
      << "conv2d dx by phases for " << d.ToString();
  const float* in = parts.data<float>();
  float* out = dx.data<float>();
#pragma omp parallel for if (dx.numel() > kParallelMin)
  for (int64_t r = 0; r < d.n * oh; ++r) {  // dx's row 2m + pi of image n, r = n * oh + m
    const int64_t n = r / oh, m = r % oh;
    InterleaveRow(in + r * ow * d.c, in + part + r * ow * d.c,
                  out + (n * d.h + 2 * m + pi) * d.w * d.c, d.w, d.c);
  }
}

bool CpuBackend::SubsamplesInput(const Conv2dDesc& d) {
  // H and W multiples of the stride: oneDNN refuses a strided view whose rows, stride apart,
  // would run past the image (it checks OH * stride rows against the image's stride).
  return (d.precision == Precision::kBF16 || (d.precision == Precision::kF32 && d.dx_sub)) &&
         d.r == 1 && d.s == 1 && d.pad == 0 && d.stride > 1 && d.h % d.stride == 0 &&
         d.w % d.stride == 0 && d.x_nhwc && d.y_nhwc;
}

bool CpuBackend::PlansGemm(const Conv2dDesc& d) const {
  return fusions_ && UnfoldsWeightGradient(d) && d.out_h() * d.out_w() <= 16;
}

bool CpuBackend::PlansSubsample(const Conv2dDesc& d) const {
  return fusions_ && !PlansGemm(d) && SubsamplesInput(d);
}

bool CpuBackend::PlannedGemm(const OpPlan& plan) {
  const auto* p = dynamic_cast<const ConvPlan*>(&plan);
  return p != nullptr && p->gemm;
}

bool CpuBackend::PlannedSubsample(const OpPlan& plan) {
  const auto* p = dynamic_cast<const ConvPlan*>(&plan);
  return p != nullptr && p->subsample;
}

void Spread(const ConvPlan& p, const Tensor& dx_sub, const Tensor& dx) {
  const Conv2dDesc& d = p.d;
  DPT_CHECK(dx.dtype() == DType::kF32 && dx.numel() == d.n * d.c * d.h * d.w)
      << "conv2d dx " << dx.shape().ToString() << " for " << d.ToString();
  const int64_t s = d.stride, oh = d.out_h(), ow = d.out_w(), c = d.c;
  DPT_CHECK(dx_sub.dtype() == DType::kF32 && dx_sub.numel() == d.n * oh * ow * c)
      << "conv2d strided dx for " << d.ToString();
  const float* in = dx_sub.data<float>();
  float* out = dx.data<float>();
#pragma omp parallel for if (dx.numel() > kParallelMin)
  for (int64_t row = 0; row < d.n * d.h; ++row) {
    const int64_t n = row / d.h, h = row % d.h;
    float* o = out + row * d.w * c;
    if (h % s != 0 || h / s >= oh) {
      std::fill_n(o, d.w * c, 0.f);
      continue;
    }
    const float* src = in + (n * oh + h / s) * ow * c;
    for (int64_t w = 0; w < d.w; ++w, o += c) {
      if (w % s == 0 && w / s < ow) {
        std::copy_n(src + w / s * c, c, o);
      } else {
        std::fill_n(o, c, 0.f);
      }
    }
  }
}

bool CpuBackend::UnfoldsWeightGradient(const Conv2dDesc& d) {
  const int64_t pixels = d.out_h() * d.out_w(),
                cols_bytes = 2 * d.n * pixels * d.weight_numel() / d.k;
  const bool strided = d.stride > 1 && d.weight_numel() >= 16384 && cols_bytes <= (16 << 20);
  return d.precision == Precision::kBF16 && d.x_nhwc && d.y_nhwc && d.groups == 1 &&
         (pixels <= 16 || strided) && PrecisionOk(d.precision);
}

namespace {
DPT_SIMD_CLONES void ToBf16(const float* in, uint16_t* out, int64_t n) { Bf16BitsRun(in, out, n); }

// x's dtype (f32, or bf16 for Conv2dDesc::x_bf16) and size.
void CheckX(const Conv2dDesc& d, const Tensor& x) {
  DPT_CHECK(x.dtype() == (d.x_bf16 ? DType::kBF16 : DType::kF32))
      << "conv2d x: " << DTypeName(x.dtype()) << " for " << d.ToString();
  DPT_CHECK(x.numel() == d.n * d.c * d.h * d.w) << x.shape().ToString() << " for " << d.ToString();
}
}  // namespace

void Col2Im(const ConvPlan& p, const Tensor& dcols, const Tensor& dx) {
  const Conv2dDesc& d = p.d;
  DPT_CHECK(d.x_nhwc && dx.dtype() == DType::kF32 && dx.numel() == d.n * d.c * d.h * d.w)
      << "conv2d dx " << dx.shape().ToString() << " for " << d.ToString();
  const int64_t oh = d.out_h(), ow = d.out_w(), c = d.c, taps = d.r * d.s * d.c;
  DPT_CHECK(dcols.dtype() == DType::kF32 && dcols.numel() == d.n * oh * ow * taps)
      << "conv2d input-gradient columns for " << d.ToString();
  const float* cols = dcols.data<float>();
  float* out = dx.data<float>();
  // Each input pixel gathers the entries of the windows holding it, in (r, s) order: the same
  // sum on any thread count.
#pragma omp parallel for if (dx.numel() > kParallelMin)
  for (int64_t row = 0; row < d.n * d.h; ++row) {
    const int64_t n = row / d.h, ih = row % d.h;
    for (int64_t iw = 0; iw < d.w; ++iw) {
      float* o = out + (row * d.w + iw) * c;
      std::fill_n(o, c, 0.f);
      for (int64_t r = 0; r < d.r; ++r) {
        const int64_t hi = ih + d.pad - r * d.dilation;
        if (hi < 0 || hi % d.stride != 0 || hi / d.stride >= oh) continue;
        for (int64_t s = 0; s < d.s; ++s) {
          const int64_t wi = iw + d.pad - s * d.dilation;
          if (wi < 0 || wi % d.stride != 0 || wi / d.stride >= ow) continue;
          const float* src =
              cols + ((n * oh + hi / d.stride) * ow + wi / d.stride) * taps + (r * d.s + s) * c;
#pragma omp simd
          for (int64_t k = 0; k < c; ++k) o[k] += src[k];
        }
      }
    }
  }
}

void Unfold(const ConvPlan& p, const Tensor& x, const Tensor& cols_t) {
  const Conv2dDesc& d = p.d;
  CheckX(d, x);
  DPT_CHECK(d.x_nhwc) << "unfolded " << d.ToString();
  const float* in = d.x_bf16 ? nullptr : x.data<float>();
  const auto* in16 = d.x_bf16 ? static_cast<const uint16_t*>(x.raw()) : nullptr;
  const int64_t oh = d.out_h(), ow = d.out_w(), rows = d.n * oh * ow, taps = d.r * d.s * d.c;
  DPT_CHECK(cols_t.dtype() == DType::kBF16 && cols_t.numel() == rows * taps)
      << "conv2d unfolded input for " << d.ToString();
  auto* cols = static_cast<uint16_t*>(cols_t.raw());
#pragma omp parallel for if (rows * taps > kParallelMin)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t n = row / (oh * ow), i = row / ow % oh, j = row % ow;
    uint16_t* out = cols + row * taps;
    for (int64_t r = 0; r < d.r; ++r) {
      const int64_t ih = i * d.stride - d.pad + r * d.dilation;
      const int64_t iw0 = j * d.stride - d.pad;  // tap s reads column iw0 + s * dilation
      // Undilated, the row's taps in the image read adjacent pixels: one run of C channels each,
      // contiguous in x as in cols (a 3x3's three taps of a row: one copy instead of three).
      int64_t lo = 0, hi = d.s;  // the taps in the image: [lo, hi)
      if (ih < 0 || ih >= d.h) {
        hi = 0;
      } else {
        while (lo < d.s && iw0 + lo * d.dilation < 0) ++lo;
        while (hi > lo && iw0 + (hi - 1) * d.dilation >= d.w) --hi;
      }
      std::fill_n(out, lo * d.c, uint16_t{0});
      for (int64_t s = lo; s < hi; s += d.dilation == 1 ? hi - lo : 1) {
        const int64_t run = (d.dilation == 1 ? hi - lo : 1) * d.c;
        const int64_t at = ((n * d.h + ih) * d.w + iw0 + s * d.dilation) * d.c;
        if (in16 != nullptr) {
          std::copy_n(in16 + at, run, out + s * d.c);
        } else {
          ToBf16(in + at, out + s * d.c, run);
        }
      }
      std::fill_n(out + hi * d.c, (d.s - hi) * d.c, uint16_t{0});
      out += d.s * d.c;
    }
  }
}

void CpuBackend::Conv2dForward(const OpPlan& plan, const Tensor& x, const Tensor& w,
                               const Tensor* b, Tensor* y) {
  OpScope scope(this, "conv2d_fwd");
  const auto& p = static_cast<const ConvPlan&>(plan);
  scope.set_flops(p.d.flops());
  CheckX(p.d, x);
  DPT_CHECK(!p.d.bias || b != nullptr) << "conv2d with bias needs a bias tensor";
  DPT_CHECK(y->dtype() == (p.d.y_bf16 ? DType::kBF16 : DType::kF32))
      << "conv2d y: " << DTypeName(y->dtype()) << " for " << p.d.ToString();
  impl_->Forward(p, x, w, b, y);
}

namespace {
void CheckDy(const Conv2dDesc& d, const Tensor& dy) {
  DPT_CHECK(dy.dtype() == (d.dy_bf16 ? DType::kBF16 : DType::kF32))
      << "conv2d dy: " << DTypeName(dy.dtype()) << " for " << d.ToString();
}
// dx: f32, (N, C, H, W), or (N, C, OH, OW) with Conv2dDesc::dx_sub; null for no input gradient.
void CheckDx(const Conv2dDesc& d, const Tensor* dx) {
  if (dx == nullptr) return;
  const int64_t pixels = d.dx_sub ? d.out_h() * d.out_w() : d.h * d.w;
  DPT_CHECK(dx->dtype() == DType::kF32 && dx->numel() == d.n * d.c * pixels)
      << "conv2d dx: " << DTypeName(dx->dtype()) << " " << dx->shape().ToString() << " for "
      << d.ToString();
}
}  // namespace

void CpuBackend::Conv2dBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                    Tensor* dx) {
  OpScope scope(this, "conv2d_bwd_data");
  const auto& p = static_cast<const ConvPlan&>(plan);
  CheckDy(p.d, dy);
  CheckDx(p.d, dx);
  scope.set_flops(p.d.flops());
  impl_->BackwardData(p, dy, w, dx);
}

void CpuBackend::Conv2dBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                       Tensor* dw, Tensor* db, bool accumulate) {
  OpScope scope(this, "conv2d_bwd_weights");
  const auto& p = static_cast<const ConvPlan&>(plan);
  CheckX(p.d, x);
  CheckDy(p.d, dy);
  scope.set_flops(p.d.flops());
  impl_->BackwardWeights(p, x, dy, dw, db, accumulate);
}

void CpuBackend::Conv2dBackward(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                const Tensor& w, Tensor* dx, Tensor* dw, Tensor* db,
                                bool accumulate) {
  const auto& p = static_cast<const ConvPlan&>(plan);
  CheckX(p.d, x);
  CheckDy(p.d, dy);
  CheckDx(p.d, dx);
  WeightedBackward(plan, p.d.flops(), "conv2d_bwd_weights", "conv2d_bwd_data", x, dy, w, dx, dw, db,
                   accumulate);
}

}  // namespace dptrain::cpu
