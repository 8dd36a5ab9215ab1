// SPDX-License-Identifier: Apache-2.0
// CPU backend: pooling. Average pooling, and max pooling of channels-last tensors with windows up
// to 16 x 16, on loops over the window arithmetic of core/pool_window.h, which the CUDA kernels
// share; other max pooling on oneDNN primitives (planned once per shape and cached). Max pooling
// keeps where each maximum came from in the caller's workspace. The own max pooling may write its
// output (and read its gradient) in NCHW from channels-last input (PoolDesc::y_nchw).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_backend_impl.h"
#include "core/error.h"

namespace dptrain::cpu {
namespace {

// ---- channels-last max pooling (PoolPlan::own) ----
// A pixel's C channels are contiguous, so each window position is a contiguous run of channels,
// taken kLanes at a time. The workspace holds, per output value, the index of its maximum in the
// unclipped window (row-major: (ih - h_start) * kernel + iw - w_start), a byte, so kernels up to
// 16. Ties go to the first maximum in row-major window order, and a NaN wins over any number
// (the window's last NaN), as in PyTorch and the CUDA kernels (kernels.cu). The backward gathers
// each input's gradient from the windows covering it, in the CUDA kernel's order: no zero-fill
// pass and no scatter; each dx element is written once.

constexpr int64_t kLanes = 16;  // channels per step: one AVX-512 register of floats

// The backward's step of kLanes channels as one vector (GCC's vector extension, as
// cpu_conv_pool.cc; AVX-512 in the clone built for it): 0.39 ms for ref_cnn's second pool at batch
// 256 on 2 threads, against 0.62 as an `omp simd` loop over arrays. The forward is such a loop:
// GCC 12 compiles a vector-extension select under two combined masks (`a > b | a != a`) one lane
// at a time in a target_clones function.
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using Mask = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
using Bytes = uint8_t __attribute__((vector_size(kLanes)));
using Halves = uint16_t __attribute__((vector_size(kLanes * sizeof(uint16_t))));  // bytes widened

using Columns = PoolPlan::Columns;

// Where y's (and dy's) value for output column ow and channel ch of one output row is, from the
// row's first value: ow * pix + ch * chan. Channels-last (C, 1); NCHW (PoolDesc::y_nchw: the
// flatten after the pool then reads it as it is) (1, P * Q). Value (i, oh, ow, ch) is at
// i * C * P * Q + (oh * Q + ow) * pix + ch * chan in both. The workspace stays channels-last.
struct OutAt {
  int64_t pix, chan;
};
OutAt OutLayout(const PoolPlan& p) {
  return p.d.y_nchw ? OutAt{1, p.g.p * p.g.q} : OutAt{p.d.c, 1};
}
// A step of kLanes channels' outputs into y, and dy's out of it, at channel stride `chan`.
DPT_CLONE_INLINE void StoreOut(const float* best, float* y, int64_t chan) {
  if (chan == 1) {
    for (int64_t j = 0; j < kLanes; ++j) y[j] = best[j];
    return;
  }
  for (int64_t j = 0; j < kLanes; ++j) y[j * chan] = best[j];
}
DPT_CLONE_INLINE void LoadOut(const float* dy, int64_t chan, Vec* v) {
  if (chan == 1) {
    std::memcpy(v, dy, sizeof(Vec));
    return;
  }
  float s[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) s[j] = dy[j * chan];
  std::memcpy(v, s, sizeof(Vec));
}

// PoolPlan::window and cover, once per plan: the same for every row of every call (ew::WindowOf
// and ew::Covering per output value and lane step cost more than the pass over memory).
void PlanColumns(PoolPlan* p) {
  const ew::PoolGeom& g = p->g;
  for (int64_t ow = 0; ow < g.q; ++ow) {
    const ew::PoolWindow win = ew::WindowOf(g, 0, ow);
    p->window.lo.push_back(win.w0);
    p->window.hi.push_back(win.w1);
    p->window.start.push_back(ow * g.stride - g.pad);
  }
  for (int64_t iw = 0; iw < g.w; ++iw) {
    const ew::PoolCover cover = ew::Covering(g, 0, iw);
    p->cover.lo.push_back(cover.q0);
    p->cover.hi.push_back(cover.q1);
  }
}

// Output row oh of one image: y_row (Q pixels of c channels) and, in training, ws_row.
DPT_SIMD_CLONES void MaxPoolRow(const ew::PoolGeom& g, const Columns& cols, int64_t c,
                                const float* x_img, int64_t oh, float* y_row, OutAt at,
                                uint8_t* ws_row) {
  const ew::PoolWindow rows = ew::WindowOf(g, oh, 0);
  const int64_t h_start = oh * g.stride - g.pad;
  for (int64_t ow = 0; ow < g.q; ++ow) {
    const int64_t w0 = cols.lo[static_cast<size_t>(ow)], w1 = cols.hi[static_cast<size_t>(ow)];
    const int64_t w_start = cols.start[static_cast<size_t>(ow)];
    const auto index = [&](int64_t ih, int64_t iw) {
      return static_cast<int32_t>((ih - h_start) * g.kernel + iw - w_start);
    };
    int64_t c0 = 0;
    for (; c0 + kLanes <= c; c0 += kLanes) {
      float best[kLanes];
      int32_t arg[kLanes];
      const float* first = x_img + (rows.h0 * g.w + w0) * c + c0;
      const int32_t k0 = index(rows.h0, w0);
      for (int64_t j = 0; j < kLanes; ++j) best[j] = first[j], arg[j] = k0;
      for (int64_t ih = rows.h0; ih < rows.h1; ++ih) {
        for (int64_t iw = ih == rows.h0 ? w0 + 1 : w0; iw < w1; ++iw) {
          const float* v = x_img + (ih * g.w + iw) * c + c0;
          const int32_t k = index(ih, iw);
#pragma omp simd
          for (int64_t j = 0; j < kLanes; ++j) {
            const bool take = v[j] > best[j] || v[j] != v[j];  // v[j] != v[j]: a NaN
            best[j] = take ? v[j] : best[j];
            arg[j] = take ? k : arg[j];
          }
        }
      }
      StoreOut(best, y_row + ow * at.pix + c0 * at.chan, at.chan);
      if (ws_row != nullptr) {
        uint8_t* ws = ws_row + ow * c + c0;
        for (int64_t j = 0; j < kLanes; ++j) ws[j] = static_cast<uint8_t>(arg[j]);
      }
    }
    for (; c0 < c; ++c0) {  // the last channels, one at a time
      float best = x_img[(rows.h0 * g.w + w0) * c + c0];
      int32_t arg = index(rows.h0, w0);
      for (int64_t ih = rows.h0; ih < rows.h1; ++ih) {
        for (int64_t iw = ih == rows.h0 ? w0 + 1 : w0; iw < w1; ++iw) {
          const float v = x_img[(ih * g.w + iw) * c + c0];
          if (v > best || v != v) best = v, arg = index(ih, iw);
        }
      }
      y_row[ow * at.pix + c0 * at.chan] = best;
      if (ws_row != nullptr) ws_row[ow * c + c0] = static_cast<uint8_t>(arg);
    }
  }
}

// A step of gradients (or one) into dx, in f32 or rounded to bf16 (PoolDesc::dx_bf16).
[[gnu::always_inline]] inline void StoreGrads(Vec s, float* dx) {
  std::memcpy(dx, &s, sizeof(Vec));
}
[[gnu::always_inline]] inline void StoreGrads(Vec s, uint16_t* dx) {
  float v[kLanes];
  std::memcpy(v, &s, sizeof(Vec));
  Bf16Bits16(v, dx);
}
DPT_CLONE_INLINE void StoreGrad(float s, float* dx) { *dx = s; }
DPT_CLONE_INLINE void StoreGrad(float s, uint16_t* dx) { *dx = Bf16Bits(s); }

// Input row ih of one image's gradient (W pixels of c channels): each value the sum, in the
// order of the covering windows, of the dy of those whose maximum it was.
template <class T>
DPT_CLONE_INLINE void MaxPoolGradRowOf(const ew::PoolGeom& g, const Columns& cover, int64_t c,
                                       const float* dy_img, OutAt at, const uint8_t* ws_img,
                                       int64_t ih, T* dx_row) {
  const ew::PoolCover rows = ew::Covering(g, ih, 0);
  for (int64_t iw = 0; iw < g.w; ++iw) {
    const int64_t q0 = cover.lo[static_cast<size_t>(iw)], q1 = cover.hi[static_cast<size_t>(iw)];
    const auto index = [&](int64_t p, int64_t q) {
      return static_cast<int32_t>((ih - (p * g.stride - g.pad)) * g.kernel + iw -
                                  (q * g.stride - g.pad));
    };
    int64_t c0 = 0;
    for (; c0 + kLanes <= c; c0 += kLanes) {
      Vec s{};
      for (int64_t p = rows.p0; p < rows.p1; ++p) {
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t pix = p * g.q + q;
          Vec gy;
          LoadOut(dy_img + pix * at.pix + c0 * at.chan, at.chan, &gy);
          Bytes from;
          std::memcpy(&from, ws_img + pix * c + c0, sizeof(Bytes));
          const Mask pos = __builtin_convertvector(__builtin_convertvector(from, Halves), Mask);
          s += pos == index(p, q) ? gy : Vec{};
        }
      }
      StoreGrads(s, dx_row + iw * c + c0);
    }
    for (; c0 < c; ++c0) {  // the last channels, one at a time
      float s = 0.f;
      for (int64_t p = rows.p0; p < rows.p1; ++p) {
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t pix = p * g.q + q;
          s += ws_img[pix * c + c0] == index(p, q) ? dy_img[pix * at.pix + c0 * at.chan] : 0.f;
        }
      }
      StoreGrad(s, dx_row + iw * c + c0);
    }
  }
}
DPT_SIMD_CLONES void MaxPoolGradRow(const ew::PoolGeom& g, const Columns& cover, int64_t c,
                                    const float* dy_img, OutAt at, const uint8_t* ws_img,
                                    int64_t ih, float* dx_row) {
  MaxPoolGradRowOf(g, cover, c, dy_img, at, ws_img, ih, dx_row);
}
DPT_SIMD_CLONES void MaxPoolGradRow(const ew::PoolGeom& g, const Columns& cover, int64_t c,
                                    const float* dy_img, OutAt at, const uint8_t* ws_img,
                                    int64_t ih, uint16_t* dx_row) {
  MaxPoolGradRowOf(g, cover, c, dy_img, at, ws_img, ih, dx_row);
}

// ---- 2 x 2 windows at stride 2, none clipped (PoolPlan::pair_rows) ----
// The same values, indices and gradients as the loops above, with each output pixel's four
// inputs read once and each gradient written from its one window: an output row reads two input
// rows and the backward writes them.
// One output pixel's kLanes channels from its window's four inputs (each kLanes channels, in
// row-major window order): the maximum and its window index.
DPT_CLONE_INLINE void MaxOf4(const float* v0, const float* v1, const float* v2, const float* v3,
                             float* best, int32_t* arg) {
#pragma omp simd
  for (int64_t j = 0; j < kLanes; ++j) {
    float b = v0[j];
    int32_t a = 0;
    bool take = v1[j] > b || v1[j] != v1[j];  // v != v: a NaN
    b = take ? v1[j] : b;
    a = take ? 1 : a;
    take = v2[j] > b || v2[j] != v2[j];
    b = take ? v2[j] : b;
    a = take ? 2 : a;
    take = v3[j] > b || v3[j] != v3[j];
    best[j] = take ? v3[j] : b;
    arg[j] = take ? 3 : a;
  }
}
DPT_CLONE_INLINE void StoreArgs(const int32_t* arg, uint8_t* ws) {
  for (int64_t j = 0; j < kLanes; ++j) ws[j] = static_cast<uint8_t>(arg[j]);
}
DPT_SIMD_CLONES void MaxPool2Row(int64_t q, int64_t w, int64_t c, const float* top, float* y_row,
                                 uint8_t* ws_row) {
  const float* bottom = top + w * c;
  for (int64_t ow = 0; ow < q; ++ow) {
    const float* v0 = top + 2 * ow * c;
    const float* v2 = bottom + 2 * ow * c;
    for (int64_t c0 = 0; c0 < c; c0 += kLanes) {
      float best[kLanes];
      int32_t arg[kLanes];
      MaxOf4(v0 + c0, v0 + c + c0, v2 + c0, v2 + c + c0, best, arg);
      std::memcpy(y_row + ow * c + c0, best, sizeof(best));
      if (ws_row != nullptr) StoreArgs(arg, ws_row + ow * c + c0);
    }
  }
}
// The same for a whole image with y in NCHW (PoolDesc::y_nchw): 16 output pixels (in NCHW's
// order, across rows) by 16 channels at a time, transposed in registers into 16 runs of one
// channel's pixels; stores of one value a lane (OutAt) took twice the channels-last pass.
DPT_SIMD_CLONES void MaxPool2ImageNchw(const ew::PoolGeom& g, int64_t c, const float* x_img,
                                       float* y_img, uint8_t* ws_img) {
  const int64_t pq = g.p * g.q;
  for (int64_t pix0 = 0; pix0 < pq; pix0 += kTile) {
    const int64_t count = std::min(kTile, pq - pix0);
    for (int64_t c0 = 0; c0 < c; c0 += kTile) {
      TileRow t[kTile];
      for (int64_t k = count; k < kTile; ++k) t[k] = TileRow{};  // a last part tile's other rows
      for (int64_t k = 0; k < count; ++k) {
        const int64_t oh = (pix0 + k) / g.q, ow = (pix0 + k) % g.q;
        const float* v0 = x_img + (2 * oh * g.w + 2 * ow) * c + c0;
        const float* v2 = v0 + g.w * c;
        float best[kLanes];
        int32_t arg[kLanes];
        MaxOf4(v0, v0 + c, v2, v2 + c, best, arg);
        std::memcpy(&t[k], best, sizeof(best));
        if (ws_img != nullptr) StoreArgs(arg, ws_img + (pix0 + k) * c + c0);
      }
      TransposeTile(t);
      for (int64_t j = 0; j < kTile; ++j) {
        float* run = y_img + (c0 + j) * pq + pix0;
        if (count == kTile) {
          std::memcpy(run, &t[j], sizeof(TileRow));
        } else {
          for (int64_t k = 0; k < count; ++k) run[k] = t[j][k];
        }
      }
    }
  }
}
// The gradients of input rows 2 oh and 2 oh + 1 from output row oh: dy where the window's
// maximum was, else 0 (added to a zero, as the loops above sum, so a -0 comes out +0).
template <class T>
DPT_CLONE_INLINE void MaxPool2GradRowOf(int64_t q, int64_t w, int64_t c, const float* dy_row,
                                        OutAt at, const uint8_t* ws_row, T* top) {
  T* bottom = top + w * c;
  for (int64_t ow = 0; ow < q; ++ow) {
    const int64_t in = 2 * ow * c;
    for (int64_t c0 = 0; c0 < c; c0 += kLanes) {
      Vec gy;
      LoadOut(dy_row + ow * at.pix + c0 * at.chan, at.chan, &gy);
      Bytes from;
      std::memcpy(&from, ws_row + ow * c + c0, sizeof(Bytes));
      const Mask pos = __builtin_convertvector(__builtin_convertvector(from, Halves), Mask);
      const Mask bits = reinterpret_cast<Mask>(gy);
      StoreGrads(Vec{} + reinterpret_cast<Vec>(bits & (pos == 0)), top + in + c0);
      StoreGrads(Vec{} + reinterpret_cast<Vec>(bits & (pos == 1)), top + in + c + c0);
      StoreGrads(Vec{} + reinterpret_cast<Vec>(bits & (pos == 2)), bottom + in + c0);
      StoreGrads(Vec{} + reinterpret_cast<Vec>(bits & (pos == 3)), bottom + in + c + c0);
    }
  }
}
DPT_SIMD_CLONES void MaxPool2GradRow(int64_t q, int64_t w, int64_t c, const float* dy_row, OutAt at,
                                     const uint8_t* ws_row, float* top) {
  MaxPool2GradRowOf(q, w, c, dy_row, at, ws_row, top);
}
DPT_SIMD_CLONES void MaxPool2GradRow(int64_t q, int64_t w, int64_t c, const float* dy_row, OutAt at,
                                     const uint8_t* ws_row, uint16_t* top) {
  MaxPool2GradRowOf(q, w, c, dy_row, at, ws_row, top);
}

// PoolPlan::own: the forward (ws null: inference) and the backward, over every image.
void OwnMaxPoolForward(const PoolPlan& p, const float* x, float* y, uint8_t* ws) {
  const ew::PoolGeom& g = p.g;
  const int64_t n = p.d.n, c = p.d.c;
  const Columns& cols = p.window;
  const OutAt at = OutLayout(p);
  if (p.pair_rows && p.d.y_nchw) {
#pragma omp parallel for if (n * g.p * g.q * c * 4 > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t image = i * g.p * g.q * c;  // in both of y's layouts
      MaxPool2ImageNchw(g, c, x + i * g.h * g.w * c, y + image,
                        ws == nullptr ? nullptr : ws + image);
    }
    return;
  }
#pragma omp parallel for collapse(2) if (n * g.p * g.q * c * g.kernel * g.kernel > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t oh = 0; oh < g.p; ++oh) {
      const int64_t row = (i * g.p + oh) * g.q * c;  // the workspace's, channels-last
      float* y_row = y + i * c * g.p * g.q + oh * g.q * at.pix;
      uint8_t* ws_row = ws == nullptr ? nullptr : ws + row;
      if (p.pair_rows) {
        MaxPool2Row(g.q, g.w, c, x + (i * g.h + 2 * oh) * g.w * c, y_row, ws_row);
      } else {
        MaxPoolRow(g, cols, c, x + i * g.h * g.w * c, oh, y_row, at, ws_row);
      }
    }
  }
}
template <class T>
void OwnMaxPoolBackward(const PoolPlan& p, const float* dy, const uint8_t* ws, T* dx) {
  const ew::PoolGeom& g = p.g;
  const int64_t n = p.d.n, c = p.d.c;
  const Columns& cover = p.cover;
  const OutAt at = OutLayout(p);
  if (p.pair_rows) {
#pragma omp parallel for collapse(2) if (n * g.h * g.w * c > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t oh = 0; oh < g.p; ++oh) {
        const int64_t row = (i * g.p + oh) * g.q * c;
        const float* dy_row = dy + i * c * g.p * g.q + oh * g.q * at.pix;
        MaxPool2GradRow(g.q, g.w, c, dy_row, at, ws + row, dx + (i * g.h + 2 * oh) * g.w * c);
      }
    }
    return;
  }
#pragma omp parallel for collapse(2) if (n * g.h * g.w * c > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ih = 0; ih < g.h; ++ih) {
      const int64_t image = i * g.p * g.q * c;  // in both of y's layouts
      MaxPoolGradRow(g, cover, c, dy + image, at, ws + image, ih, dx + (i * g.h + ih) * g.w * c);
    }
  }
}

}  // namespace

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
  if (d.nhwc && d.kernel <= kOwnMaxPoolKernel) {
    p->own = true;
    p->pair_rows = d.kernel == 2 && d.stride == 2 && d.pad == 0 && d.h == 2 * d.out_h() &&
                   d.w == 2 * d.out_w() && d.c % kLanes == 0;
    PlanColumns(p.get());
    p->workspace_bytes = static_cast<size_t>(d.n * d.c * d.out_h() * d.out_w());
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
  if (training) {
    DPT_CHECK(ws->bytes() >= p.workspace_bytes) << "pool workspace too small";
  }
  if (p.own) {
    OwnMaxPoolForward(p, x.data<float>(), y->data<float>(),
                      training ? static_cast<uint8_t*>(ws->raw()) : nullptr);
    return;
  }
  const auto& pd = training ? p.train_pd : p.infer_pd;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, impl_->Mem(p.x_md, x)},
                                       {DNNL_ARG_DST, impl_->Mem(p.y_md, *y)},
                                       {DNNL_ARG_SCRATCHPAD, impl_->Scratch(pd.scratchpad_desc())}};
  if (training) {
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
  if (p.own) {
    DPT_CHECK(ws->bytes() >= p.workspace_bytes) << "pool workspace too small";
    const auto* at = static_cast<const uint8_t*>(ws->raw());
    if (p.d.dx_bf16) {
      OwnMaxPoolBackward(p, dy.data<float>(), at, static_cast<uint16_t*>(dx->raw()));
    } else {
      OwnMaxPoolBackward(p, dy.data<float>(), at, dx->data<float>());
    }
    return;
  }
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
