// SPDX-License-Identifier: Apache-2.0
// CPU backend: the per-channel and per-row reductions: batch norm (training, inference,
// backward, statistics accumulated in double) and the losses (softmax cross-entropy, MSE).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_backend_impl.h"
#include "core/elementwise.h"
#include "core/error.h"

namespace dptrain::cpu {

// ---- batch norm --------------------------------------------------------------------------
// Per channel, over its N runs of H*W contiguous elements: each run goes through one of the
// vectorised loops below (double accumulators; `omp simd` lets the compiler split each sum over
// vector lanes, a fixed order for a given build and CPU, so reruns are bit-identical; the clone
// picked for the CPU (DPT_SIMD_CLONES: AVX-512, AVX2 or the baseline) sets the lane count, so
// two kinds of CPU may differ in a sum's last bits).

namespace {

// sum(x - shift) and sum((x - shift)^2) of one run, added to *s1 and *s2: one pass for both
// statistics. The shift (a value of the channel) keeps the variance's subtraction of two large
// sums exact enough in double when the mean is large against the spread.
DPT_SIMD_CLONES void RunMoments(const float* p, int64_t n, double shift, double* s1, double* s2) {
  double a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
  for (int64_t j = 0; j < n; ++j) {
    const double v = p[j] - shift;
    a += v;
    b += v * v;
  }
  *s1 += a;
  *s2 += b;
}

// The backward loops over one run, with dy as the batch norm's own output sees it: `dy_at(j)`
// is dy[j], or dy[j] gated by the folded ReLU's output (ew::ReluGrad). That output is not read:
// the gate is the forward's affine value recomputed from x (ew::BnFold of the saved mean and
// 1/std gives the forward's scale and shift to the bit, and ew::BnApply rounds as it did), one
// pass over memory less than reading y. Inlined into the vectorised entry points below, one per
// case, so that no loop tests for the ReLU per element. The element math is f32 (ew::BnDyXc,
// ew::BnDx), the sums double.
struct BnGradTerms {
  float mean;                // as saved by the forward
  double sum_dy, sum_dy_xc;  // sum(dy), sum(dy * (x - mean))
  ew::BnDxTerms dx;          // folded from the sums
};

// sum(dy) and sum(dy * (x - mean)) of one run, added to t->sum_dy and t->sum_dy_xc.
template <class Dy>
DPT_CLONE_INLINE void GradSums(Dy dy_at, const float* x, int64_t n, BnGradTerms* t) {
  double s = 0, sx = 0;
  const float mean = t->mean;
#pragma omp simd reduction(+ : s, sx)
  for (int64_t j = 0; j < n; ++j) {
    const float gj = dy_at(j);
    s += gj;
    sx += ew::BnDyXc(gj, x[j], mean);
  }
  t->sum_dy += s;
  t->sum_dy_xc += sx;
}

// dx[j] = value(j) for j in [0, n), stored in f32, or rounded to bf16 (BatchNormArgs::dx_bf16):
// 16 values at a time computed in f32 and rounded together (Bf16Bits16), the tail one by one
// (Bf16Bits, the same rounding).
template <class V>
DPT_CLONE_INLINE void Store(float* dx, int64_t n, V value) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dx[j] = value(j);
}
template <class V>
DPT_CLONE_INLINE void Store(uint16_t* dx, int64_t n, V value) {
  int64_t j0 = 0;
  for (; j0 + 16 <= n; j0 += 16) {
    float v[16];
#pragma omp simd
    for (int64_t j = 0; j < 16; ++j) v[j] = value(j0 + j);
    Bf16Bits16(v, dx + j0);
  }
  for (; j0 < n; ++j0) dx[j0] = Bf16Bits(value(j0));
}

// y of one run, x * scale + shift (then ReLU), stored in f32 or in bf16 (BatchNormArgs::y_bf16)
// as Store rounds.
template <class T>
DPT_CLONE_INLINE void AffineRun(const float* p, T* q, int64_t n, ew::BnAffine affine, bool relu) {
  if (relu) {
    Store(
        q, n, [&](int64_t j) __attribute__((always_inline)) {
          return ew::Relu(ew::BnApply(p[j], affine));
        });
  } else {
    Store(
        q, n, [&](int64_t j) __attribute__((always_inline)) { return ew::BnApply(p[j], affine); });
  }
}
DPT_SIMD_CLONES void RunAffine(const float* p, float* q, int64_t n, ew::BnAffine affine,
                               bool relu) {
  AffineRun(p, q, n, affine, relu);
}
DPT_SIMD_CLONES void RunAffine(const float* p, uint16_t* q, int64_t n, ew::BnAffine affine,
                               bool relu) {
  AffineRun(p, q, n, affine, relu);
}

// dx of one run; dx may be the folded ReLU's output (each element is read before it is written).
template <class Dy, class T>
DPT_CLONE_INLINE void GradInput(Dy dy_at, const float* x, T* dx, int64_t n, const BnGradTerms& t) {
  const float mean = t.mean;
  const ew::BnDxTerms terms = t.dx;
  const auto dx_at = [&](int64_t j) __attribute__((always_inline)) {
    return ew::BnDx(dy_at(j), x[j], mean, terms);
  };
  Store(dx, n, dx_at);
}

// ew::ReluGrad(y, g) (g where y > 0, else +0) as a bit mask instead of a branch: the compiler
// turned the select into a jump per element, mispredicted half the time (15x slower).
DPT_CLONE_INLINE float ReluGate(float y, float g) {
  const uint32_t keep = -static_cast<uint32_t>(y > 0.f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(g) & keep);
}

// dy as the batch norm's own output sees it: as it is, or gated by the folded ReLU.
DPT_CLONE_INLINE auto PlainDy(const float* g) {
  return [g](int64_t j) __attribute__((always_inline)) { return g[j]; };
}
DPT_CLONE_INLINE auto GatedDy(const float* g, const float* x, ew::BnAffine affine) {
  return [ g, x, affine ](int64_t j) __attribute__((always_inline)) {
    return ReluGate(ew::BnApply(x[j], affine), g[j]);
  };
}

// The vectorised entry points: one per case and dx type (GCC's target_clones does not take a
// template).
DPT_SIMD_CLONES void RunGradSums(const float* g, const float* x, int64_t n, BnGradTerms* t) {
  GradSums(PlainDy(g), x, n, t);
}
DPT_SIMD_CLONES void RunGatedGradSums(const float* g, ew::BnAffine affine, const float* x,
                                      int64_t n, BnGradTerms* t) {
  GradSums(GatedDy(g, x, affine), x, n, t);
}
DPT_SIMD_CLONES void RunGradInput(const float* g, const float* x, float* dx, int64_t n,
                                  const BnGradTerms& t) {
  GradInput(PlainDy(g), x, dx, n, t);
}
DPT_SIMD_CLONES void RunGatedGradInput(const float* g, ew::BnAffine affine, const float* x,
                                       float* dx, int64_t n, const BnGradTerms& t) {
  GradInput(GatedDy(g, x, affine), x, dx, n, t);
}
DPT_SIMD_CLONES void RunGradInput(const float* g, const float* x, uint16_t* dx, int64_t n,
                                  const BnGradTerms& t) {
  GradInput(PlainDy(g), x, dx, n, t);
}
DPT_SIMD_CLONES void RunGatedGradInput(const float* g, ew::BnAffine affine, const float* x,
                                       uint16_t* dx, int64_t n, const BnGradTerms& t) {
  GradInput(GatedDy(g, x, affine), x, dx, n, t);
}

// ---- channels-last (BatchNormArgs::nhwc): m rows of C channels each ----
// The statistics are sums over rows, taken per block of rows into per-block partial sums (one
// slot per block, then added in block order): a split that does not depend on the thread count,
// so the result is the same on any number of threads. Each row's loop runs over its channels.

struct RowBlocks {
  int64_t rows, count;  // rows per block, blocks
};
RowBlocks SplitRows(int64_t m, int64_t c) {
  const int64_t rows = std::max<int64_t>(1, (int64_t{1} << 14) / c);
  return {rows, (m + rows - 1) / rows};
}

// f(k, r0, r1) for every block k of rows [r0, r1) of m rows of c channels (SplitRows), the blocks
// split over the threads.
template <class F>
void ForRowBlocks(int64_t m, int64_t c, F f) {
  const RowBlocks b = SplitRows(m, c);
#pragma omp parallel for if (m * c > kParallelMin)
  for (int64_t k = 0; k < b.count; ++k) f(k, k * b.rows, std::min(m, (k + 1) * b.rows));
}

// A channels-last x in f32, or in bf16 (BatchNormArgs::x_bf16: a bf16 convolution's output). The
// arithmetic below reads f32 rows: a bf16 row is widened (exactly) into a local array first,
// kWide channels at a time, and the f32 row loops run on that, so every pass gives the bits of
// the f32 tensor of the same values at half the bytes read. Not the row loops templated on x's
// type: GCC vectorised those at the width of the 16-bit loads (256-bit vectors where the f32
// loops run 512-bit), and the statistics ran at half speed.
constexpr int64_t kWide = 64;
DPT_CLONE_INLINE const float* RowF32(const float* x, float* /*xf*/, int64_t /*n*/) { return x; }
// 16 at a time in vector registers (one 512-bit store, which the f32 loop's loads can take from
// the store buffer; a loop left to the vectoriser stored 128-bit pieces, and every load of the
// row after stalled), the tail one by one.
DPT_CLONE_INLINE const float* RowF32(const uint16_t* x, float* xf, int64_t n) {
  using U16x16 = uint16_t __attribute__((vector_size(32)));
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    U16x16 h;
    std::memcpy(&h, x + j, sizeof(h));
    const U32x16 u = __builtin_convertvector(h, U32x16) << 16;
    std::memcpy(xf + j, &u, sizeof(u));
  }
  for (; j < n; ++j) xf[j] = std::bit_cast<float>(static_cast<uint32_t>(x[j]) << 16);
  return xf;
}
// f(x's elements [j0, j0 + n) of the row at x as f32, j0, n) over the row's c channels: the whole
// row at once in f32, kWide at a time in bf16.
template <class X, class F>
DPT_CLONE_INLINE void ForRowChunks(const X* x, int64_t c, F f) {
  if constexpr (std::is_same_v<X, float>) {
    f(x, int64_t{0}, c);
  } else {
    float xf[kWide];
    for (int64_t j0 = 0; j0 < c; j0 += kWide) {
      const int64_t n = std::min(kWide, c - j0);
      f(RowF32(x + j0, xf, n), j0, n);
    }
  }
}

// s1[j] += x[j] - shift[j], s2[j] += (x[j] - shift[j])^2 (shift: row 0, as RunMoments).
DPT_CLONE_INLINE void RowMoments(const float* x, const double* __restrict shift, int64_t c,
                                 double* __restrict s1, double* __restrict s2) {
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) {
    const double v = static_cast<double>(x[j]) - shift[j];
    s1[j] += v;
    s2[j] += v * v;
  }
}

// RowMoments over rows [r0, r1), for rows of exactly kC channels: the shift and sums in local
// arrays kept in registers across rows (as RowsGradFixed; the same operations, so the same bits).
template <int kC, class X>
DPT_CLONE_INLINE void RowsMomentsFixed(const X* x, const double* shift, int64_t r0, int64_t r1,
                                       double* s1, double* s2) {
  double sh[kC], a[kC], b[kC];
  float xf[kC];
  for (int j = 0; j < kC; ++j) sh[j] = shift[j], a[j] = s1[j], b[j] = s2[j];
  for (int64_t r = r0; r < r1; ++r) RowMoments(RowF32(x + r * kC, xf, kC), sh, kC, a, b);
  for (int j = 0; j < kC; ++j) s1[j] = a[j], s2[j] = b[j];
}

template <class X>
DPT_CLONE_INLINE void RowsMomentsAny(const X* x, const double* shift, int64_t r0, int64_t r1,
                                     int64_t c, double* s1, double* s2) {
  if (c == 16) return RowsMomentsFixed<16>(x, shift, r0, r1, s1, s2);
  if (c == 32) return RowsMomentsFixed<32>(x, shift, r0, r1, s1, s2);
  if (c == 64) return RowsMomentsFixed<64>(x, shift, r0, r1, s1, s2);
  for (int64_t r = r0; r < r1; ++r) {
    ForRowChunks(x + r * c, c, [&](const float* p, int64_t j0, int64_t n) {
      RowMoments(p, shift + j0, n, s1 + j0, s2 + j0);
    });
  }
}
DPT_SIMD_CLONES void RowsMoments(const float* x, const double* shift, int64_t r0, int64_t r1,
                                 int64_t c, double* s1, double* s2) {
  RowsMomentsAny(x, shift, r0, r1, c, s1, s2);
}
DPT_SIMD_CLONES void RowsMoments(const uint16_t* x, const double* shift, int64_t r0, int64_t r1,
                                 int64_t c, double* s1, double* s2) {
  RowsMomentsAny(x, shift, r0, r1, c, s1, s2);
}

// One row's y = x * scale + shift (then ReLU), n channels, y in f32 or bf16 (as AffineRun).
template <class T>
DPT_CLONE_INLINE void AffineRow(const float* p, T* q, int64_t n, const float* __restrict scale,
                                const float* __restrict shift, bool relu) {
  if (relu) {
    Store(
        q, n, [&](int64_t j) __attribute__((always_inline)) {
          return ew::Relu(ew::BnApply(p[j], {scale[j], shift[j]}));
        });
  } else {
    Store(
        q, n, [&](int64_t j) __attribute__((always_inline)) {
          return ew::BnApply(p[j], {scale[j], shift[j]});
        });
  }
}
// rows [r0, r1) of that, x in f32 or bf16 (a bf16 row of 16, 32 or 64 channels widened whole,
// at a count the compiler sees).
template <class X, class T>
DPT_CLONE_INLINE void AffineRows(const X* x, T* y, int64_t r0, int64_t r1, int64_t c,
                                 const float* scale, const float* shift, bool relu) {
  if constexpr (!std::is_same_v<X, float>) {
    const auto fixed = [&](auto kc) __attribute__((always_inline)) {
      constexpr int64_t kC = decltype(kc)::value;
      float xf[kC];
      for (int64_t r = r0; r < r1; ++r) {
        AffineRow(RowF32(x + r * kC, xf, kC), y + r * kC, kC, scale, shift, relu);
      }
    };
    if (c == 16) return fixed(std::integral_constant<int64_t, 16>{});
    if (c == 32) return fixed(std::integral_constant<int64_t, 32>{});
    if (c == 64) return fixed(std::integral_constant<int64_t, 64>{});
  }
  for (int64_t r = r0; r < r1; ++r) {
    ForRowChunks(x + r * c, c, [&](const float* p, int64_t j0, int64_t n) {
      AffineRow(p, y + r * c + j0, n, scale + j0, shift + j0, relu);
    });
  }
}
DPT_SIMD_CLONES void RowsAffine(const float* x, float* y, int64_t r0, int64_t r1, int64_t c,
                                const float* scale, const float* shift, bool relu) {
  AffineRows(x, y, r0, r1, c, scale, shift, relu);
}
DPT_SIMD_CLONES void RowsAffine(const float* x, uint16_t* y, int64_t r0, int64_t r1, int64_t c,
                                const float* scale, const float* shift, bool relu) {
  AffineRows(x, y, r0, r1, c, scale, shift, relu);
}
DPT_SIMD_CLONES void RowsAffine(const uint16_t* x, float* y, int64_t r0, int64_t r1, int64_t c,
                                const float* scale, const float* shift, bool relu) {
  AffineRows(x, y, r0, r1, c, scale, shift, relu);
}
DPT_SIMD_CLONES void RowsAffine(const uint16_t* x, uint16_t* y, int64_t r0, int64_t r1, int64_t c,
                                const float* scale, const float* shift, bool relu) {
  AffineRows(x, y, r0, r1, c, scale, shift, relu);
}

// rows [r0, r1) of y = f0(x0) + f1(x1) (then ReLU), f_k(x) = x * s_k + t_k per channel where kA_k,
// x itself where not (Backend::AffineAdd): each term rounded as the batch norm's output was, then
// summed as AddLoop sums.
// y in f32, or rounded to bf16 (Backend::WritesBf16Sums) as Store rounds.
template <bool kA0, bool kA1, class T>
DPT_CLONE_INLINE void AffineAddRow(const float* p, const float* __restrict s0,
                                   const float* __restrict t0, const float* q,
                                   const float* __restrict s1, const float* __restrict t1, T* o,
                                   int64_t n, bool relu) {
  const auto term = [&](int64_t j) __attribute__((always_inline)) {
    const float a = kA0 ? ew::BnApply(p[j], {s0[j], t0[j]}) : p[j];
    const float b = kA1 ? ew::BnApply(q[j], {s1[j], t1[j]}) : q[j];
    return a + b;
  };
  if (relu) {
    Store(
        o, n, [&](int64_t j) __attribute__((always_inline)) { return ew::Relu(term(j)); });
  } else {
    Store(o, n, term);
  }
}
// x0 and x1 in f32 or bf16 (a deferred batch norm's BatchNormArgs::x_bf16 input), each row
// widened as ForRowChunks does where either is bf16.
template <bool kA0, bool kA1, class X0, class X1, class T>
DPT_CLONE_INLINE void AffineAddRows(const X0* x0, const float* s0, const float* t0, const X1* x1,
                                    const float* s1, const float* t1, T* y, int64_t r0, int64_t r1,
                                    int64_t c, bool relu) {
  float xf0[kWide], xf1[kWide];
  if constexpr (!std::is_same_v<X0, float> || !std::is_same_v<X1, float>) {
    // rows of 16, 32 or 64 channels widened whole, at a count the compiler sees
    const auto fixed = [&](auto kc) __attribute__((always_inline)) {
      constexpr int64_t kC = decltype(kc)::value;
      for (int64_t r = r0; r < r1; ++r) {
        AffineAddRow<kA0, kA1>(RowF32(x0 + r * kC, xf0, kC), s0, t0, RowF32(x1 + r * kC, xf1, kC),
                               s1, t1, y + r * kC, kC, relu);
      }
    };
    if (c == 16) return fixed(std::integral_constant<int64_t, 16>{});
    if (c == 32) return fixed(std::integral_constant<int64_t, 32>{});
    if (c == 64) return fixed(std::integral_constant<int64_t, 64>{});
  }
  const int64_t step = std::is_same_v<X0, float> && std::is_same_v<X1, float> ? c : kWide;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j0 = 0; j0 < c; j0 += step) {
      const int64_t n = std::min(step, c - j0), o = r * c + j0;
      AffineAddRow<kA0, kA1>(RowF32(x0 + o, xf0, n), kA0 ? s0 + j0 : nullptr,
                             kA0 ? t0 + j0 : nullptr, RowF32(x1 + o, xf1, n),
                             kA1 ? s1 + j0 : nullptr, kA1 ? t1 + j0 : nullptr, y + o, n, relu);
    }
  }
}
template <class X0, class X1, class T>
DPT_CLONE_INLINE void AffineAddRowsAny(const X0* x0, const float* s0, const float* t0, const X1* x1,
                                       const float* s1, const float* t1, T* y, int64_t r0,
                                       int64_t r1, int64_t c, bool relu) {
  if (s0 != nullptr && s1 != nullptr) {
    return AffineAddRows<true, true>(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
  }
  if (s0 != nullptr) return AffineAddRows<true, false>(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
  AffineAddRows<false, true>(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
}
// One entry point per pair of input types and output type.
DPT_SIMD_CLONES void RowsAffineAdd(const float* x0, const float* s0, const float* t0,
                                   const float* x1, const float* s1, const float* t1, float* y,
                                   int64_t r0, int64_t r1, int64_t c, bool relu) {
  AffineAddRowsAny(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
}
DPT_SIMD_CLONES void RowsAffineAdd(const float* x0, const float* s0, const float* t0,
                                   const uint16_t* x1, const float* s1, const float* t1, float* y,
                                   int64_t r0, int64_t r1, int64_t c, bool relu) {
  AffineAddRowsAny(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
}
DPT_SIMD_CLONES void RowsAffineAdd(const uint16_t* x0, const float* s0, const float* t0,
                                   const float* x1, const float* s1, const float* t1, float* y,
                                   int64_t r0, int64_t r1, int64_t c, bool relu) {
  AffineAddRowsAny(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
}
DPT_SIMD_CLONES void RowsAffineAdd(const uint16_t* x0, const float* s0, const float* t0,
                                   const uint16_t* x1, const float* s1, const float* t1, float* y,
                                   int64_t r0, int64_t r1, int64_t c, bool relu) {
  AffineAddRowsAny(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
}
DPT_SIMD_CLONES void RowsAffineAdd(const float* x0, const float* s0, const float* t0,
                                   const float* x1, const float* s1, const float* t1, uint16_t* y,
                                   int64_t r0, int64_t r1, int64_t c, bool relu) {
  AffineAddRowsAny(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
}
DPT_SIMD_CLONES void RowsAffineAdd(const float* x0, const float* s0, const float* t0,
                                   const uint16_t* x1, const float* s1, const float* t1,
                                   uint16_t* y, int64_t r0, int64_t r1, int64_t c, bool relu) {
  AffineAddRowsAny(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
}
DPT_SIMD_CLONES void RowsAffineAdd(const uint16_t* x0, const float* s0, const float* t0,
                                   const float* x1, const float* s1, const float* t1, uint16_t* y,
                                   int64_t r0, int64_t r1, int64_t c, bool relu) {
  AffineAddRowsAny(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
}
DPT_SIMD_CLONES void RowsAffineAdd(const uint16_t* x0, const float* s0, const float* t0,
                                   const uint16_t* x1, const float* s1, const float* t1,
                                   uint16_t* y, int64_t r0, int64_t r1, int64_t c, bool relu) {
  AffineAddRowsAny(x0, s0, t0, x1, s1, t1, y, r0, r1, c, relu);
}

// Per-channel backward terms of the NHWC loops: the saved mean, the dx terms (ew::BnDxTerms, one
// array per field) and, with the folded ReLU, the forward's scale and shift for its gate.
struct NhwcGradTerms {
  std::vector<float> mean, a, b, c, scale, shift;  // a, b, c: ew::BnDxTerms
};

// The row loops see the per-channel terms through this view (restrict pointers: reached through
// the NhwcGradTerms vectors the gated loops ran at a third to half of the plain ones' rate, since
// every store to s, sx or dx could have changed the terms as far as the compiler knew). g, x and
// dx are not restrict: dx may share a buffer with the folded ReLU's output.
struct RowTerms {
  const float* __restrict mean;
  const float* __restrict a;
  const float* __restrict b;
  const float* __restrict c;
  const float* __restrict scale;
  const float* __restrict shift;
};
RowTerms View(const NhwcGradTerms& t) {
  return {t.mean.data(), t.a.data(), t.b.data(), t.c.data(), t.scale.data(), t.shift.data()};
}

// dy of element j of a row as the batch norm's own output sees it (gated by the folded ReLU): g[j],
// or g[j] + g2[j] when the gradient comes in two parts (kSum; Backend::BatchNormBackwardSum), the
// sum Backend::Add would have written.
template <bool kGated, bool kSum>
DPT_CLONE_INLINE float RowDy(const float* g, const float* g2, const float* x, const RowTerms& t,
                             int64_t j) {
  const float gj = kSum ? g[j] + g2[j] : g[j];
  return kGated ? ReluGate(ew::BnApply(x[j], {t.scale[j], t.shift[j]}), gj) : gj;
}

template <bool kGated, bool kSum>
DPT_CLONE_INLINE void RowGradSums(const float* g, const float* g2, const float* x, int64_t c,
                                  const RowTerms& t, double* __restrict s, double* __restrict sx) {
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) {
    const float gj = RowDy<kGated, kSum>(g, g2, x, t, j);
    s[j] += gj;
    sx[j] += ew::BnDyXc(gj, x[j], t.mean[j]);
  }
}

template <bool kGated, bool kSum, class T>
DPT_CLONE_INLINE void RowGradInput(const float* g, const float* g2, const float* x, T* dx,
                                   int64_t c, const RowTerms& t) {
  const auto dx_at = [&](int64_t j) __attribute__((always_inline)) {
    return ew::BnDx(RowDy<kGated, kSum>(g, g2, x, t, j), x[j], t.mean[j], {t.a[j], t.b[j], t.c[j]});
  };
  Store(dx, c, dx_at);
}

// The gradient's rows: g, and g2 for its second part (kSum; else unused).
struct GradRows {
  const float* g;
  const float* g2;
};

// Both backward passes over rows [r0, r1) of c channels: the sums into s, sx (pass 0) or dx
// (pass 1). Inlined into the vectorised entry points below, one per case.
template <bool kGated, bool kSum, class X, class T>
DPT_CLONE_INLINE void RowsGrad(int pass, GradRows g, const X* x, T* dx, int64_t r0, int64_t r1,
                               int64_t c, const RowTerms& t, double* s, double* sx) {
  for (int64_t r = r0; r < r1; ++r) {
    ForRowChunks(x + r * c, c, [&](const float* p, int64_t j0, int64_t n) {
      const int64_t o = r * c + j0;
      const float* g2 = kSum ? g.g2 + o : nullptr;
      const RowTerms tj{t.mean + j0, t.a + j0, t.b + j0, t.c + j0, t.scale + j0, t.shift + j0};
      if (pass == 0) {
        RowGradSums<kGated, kSum>(g.g + o, g2, p, n, tj, s + j0, sx + j0);
      } else {
        RowGradInput<kGated, kSum>(g.g + o, g2, p, dx + o, n, tj);
      }
    });
  }
}

// RowsGrad for rows of exactly kC channels (16, 32 or 64): the terms and sums copied into local
// arrays the compiler keeps in registers across rows (with a run-time count it loads and stores
// the sums for every row: a store-to-load chain per short row). The same operations in the same
// order, so the same bits. `step_bench --benchmark_filter=BatchNorm` (resnet8's 64x16x32x32, 1
// thread, backward without the ReLU): 0.22 ms (f32 dx) and 0.29 ms (bf16) this way, 0.48 and 0.53
// through RowsGrad. resnet18_cifar (batch 64, bf16, 2 threads), a 64-channel backward: 2.9 ms
// with the folded ReLU and 1.7 without through RowsGrad, 2.1-2.2 and 0.8 this way; at 256 and 512
// channels this way was slower (0.24 -> 0.28 ms, 0.16 -> 0.21), at 128 the same.
template <bool kGated, bool kSum, int kC, class X, class T>
DPT_CLONE_INLINE void RowsGradFixed(int pass, GradRows g, const X* x, T* dx, int64_t r0, int64_t r1,
                                    const RowTerms& t, double* s, double* sx) {
  float xf[kC];  // a bf16 row widened (RowF32)
  double s_local[kC], sx_local[kC];
  float mean[kC], a[kC] = {}, b[kC] = {}, c[kC] = {}, scale[kC] = {}, shift[kC] = {};
  for (int j = 0; j < kC; ++j) {
    mean[j] = t.mean[j];
    if (kGated) scale[j] = t.scale[j], shift[j] = t.shift[j];
    if (pass == 0) {
      s_local[j] = s[j], sx_local[j] = sx[j];
    } else {
      a[j] = t.a[j], b[j] = t.b[j], c[j] = t.c[j];
    }
  }
  const RowTerms local{mean, a, b, c, scale, shift};
  if (pass == 0) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g2 = kSum ? g.g2 + r * kC : nullptr;
      RowGradSums<kGated, kSum>(g.g + r * kC, g2, RowF32(x + r * kC, xf, kC), kC, local, s_local,
                                sx_local);
    }
    for (int j = 0; j < kC; ++j) s[j] = s_local[j], sx[j] = sx_local[j];
    return;
  }
  for (int64_t r = r0; r < r1; ++r) {
    const float* g2 = kSum ? g.g2 + r * kC : nullptr;
    RowGradInput<kGated, kSum>(g.g + r * kC, g2, RowF32(x + r * kC, xf, kC), dx + r * kC, kC,
                               local);
  }
}

template <bool kGated, bool kSum, class X, class T>
DPT_CLONE_INLINE void RowsGradCase(int pass, GradRows g, const X* x, T* dx, int64_t r0, int64_t r1,
                                   int64_t c, const NhwcGradTerms& t, double* s, double* sx) {
  const RowTerms terms = View(t);
  if (c == 16) return RowsGradFixed<kGated, kSum, 16>(pass, g, x, dx, r0, r1, terms, s, sx);
  if (c == 32) return RowsGradFixed<kGated, kSum, 32>(pass, g, x, dx, r0, r1, terms, s, sx);
  if (c == 64) return RowsGradFixed<kGated, kSum, 64>(pass, g, x, dx, r0, r1, terms, s, sx);
  RowsGrad<kGated, kSum>(pass, g, x, dx, r0, r1, c, terms, s, sx);
}
// The gradient in one part (g.g2 null) or two.
template <bool kGated, class X, class T>
DPT_CLONE_INLINE void RowsGradAny(int pass, GradRows g, const X* x, T* dx, int64_t r0, int64_t r1,
                                  int64_t c, const NhwcGradTerms& t, double* s, double* sx) {
  if (g.g2 != nullptr) return RowsGradCase<kGated, true>(pass, g, x, dx, r0, r1, c, t, s, sx);
  RowsGradCase<kGated, false>(pass, g, x, dx, r0, r1, c, t, s, sx);
}
// The entry points, per type of x (f32, or bf16: BatchNormArgs::x_bf16): both passes with dx in
// f32, and the input-gradient pass (1) writing dx in bf16.
DPT_SIMD_CLONES void RowsGradPlain(int pass, GradRows g, const float* x, float* dx, int64_t r0,
                                   int64_t r1, int64_t c, const NhwcGradTerms& t, double* s,
                                   double* sx) {
  RowsGradAny<false>(pass, g, x, dx, r0, r1, c, t, s, sx);
}
DPT_SIMD_CLONES void RowsGradPlain(GradRows g, const float* x, uint16_t* dx, int64_t r0, int64_t r1,
                                   int64_t c, const NhwcGradTerms& t) {
  RowsGradAny<false>(1, g, x, dx, r0, r1, c, t, nullptr, nullptr);
}
DPT_SIMD_CLONES void RowsGradGated(int pass, GradRows g, const float* x, float* dx, int64_t r0,
                                   int64_t r1, int64_t c, const NhwcGradTerms& t, double* s,
                                   double* sx) {
  RowsGradAny<true>(pass, g, x, dx, r0, r1, c, t, s, sx);
}
DPT_SIMD_CLONES void RowsGradGated(GradRows g, const float* x, uint16_t* dx, int64_t r0, int64_t r1,
                                   int64_t c, const NhwcGradTerms& t) {
  RowsGradAny<true>(1, g, x, dx, r0, r1, c, t, nullptr, nullptr);
}
DPT_SIMD_CLONES void RowsGradPlain(int pass, GradRows g, const uint16_t* x, float* dx, int64_t r0,
                                   int64_t r1, int64_t c, const NhwcGradTerms& t, double* s,
                                   double* sx) {
  RowsGradAny<false>(pass, g, x, dx, r0, r1, c, t, s, sx);
}
DPT_SIMD_CLONES void RowsGradPlain(GradRows g, const uint16_t* x, uint16_t* dx, int64_t r0,
                                   int64_t r1, int64_t c, const NhwcGradTerms& t) {
  RowsGradAny<false>(1, g, x, dx, r0, r1, c, t, nullptr, nullptr);
}
DPT_SIMD_CLONES void RowsGradGated(int pass, GradRows g, const uint16_t* x, float* dx, int64_t r0,
                                   int64_t r1, int64_t c, const NhwcGradTerms& t, double* s,
                                   double* sx) {
  RowsGradAny<true>(pass, g, x, dx, r0, r1, c, t, s, sx);
}
DPT_SIMD_CLONES void RowsGradGated(GradRows g, const uint16_t* x, uint16_t* dx, int64_t r0,
                                   int64_t r1, int64_t c, const NhwcGradTerms& t) {
  RowsGradAny<true>(1, g, x, dx, r0, r1, c, t, nullptr, nullptr);
}

// The statistics of m rows of c channels: the saved mean and 1/std, the running update, and the
// scale and offset the output applies (ew::BnFold).
template <class X>
void TrainingAffineNhwc(const BatchNormArgs& a, int64_t m, int64_t c, const X* in,
                        const float* gamma, const float* beta, float* running_mean,
                        float* running_var, float* save_mean, float* save_invstd, float* scale,
                        float* offset) {
  const RowBlocks b = SplitRows(m, c);
  std::vector<double> part(static_cast<size_t>(2 * b.count * c), 0.0);
  std::vector<double> shift(static_cast<size_t>(c));  // row 0
  ForRowChunks(in, c, [&](const float* p, int64_t j0, int64_t n) {
    for (int64_t j = 0; j < n; ++j) shift[static_cast<size_t>(j0 + j)] = p[j];
  });
  ForRowBlocks(m, c, [&](int64_t k, int64_t r0, int64_t r1) {
    double* s1 = part.data() + 2 * k * c;
    RowsMoments(in, shift.data(), r0, r1, c, s1, s1 + c);
  });
  const double dm = static_cast<double>(m);
  for (int64_t j = 0; j < c; ++j) {
    double s1 = 0, s2 = 0;
    for (int64_t k = 0; k < b.count; ++k) {
      s1 += part[static_cast<size_t>(2 * k * c + j)];
      s2 += part[static_cast<size_t>((2 * k + 1) * c + j)];
    }
    const double mean = shift[j] + s1 / dm;
    const double var = std::max(0.0, (s2 - s1 * s1 / dm) / dm);
    const double invstd = ew::BnInvStd(var, a.eps);
    const ew::BnAffine affine = ew::BnFold(gamma[j], beta[j], static_cast<float>(mean), invstd);
    scale[j] = affine.scale;
    offset[j] = affine.shift;
    save_mean[j] = static_cast<float>(mean);
    save_invstd[j] = static_cast<float>(invstd);
    running_mean[j] = ew::BnRunning(running_mean[j], mean, a.momentum);
    running_var[j] = ew::BnRunning(running_var[j], ew::BnUnbiasedVar(var, m), a.momentum);
  }
}

// The scale and offset of inference: the running statistics folded (ew::BnFold).
void InferenceAffine(const BatchNormArgs& a, int64_t c, const float* gamma, const float* beta,
                     const float* running_mean, const float* running_var, float* scale,
                     float* offset) {
  for (int64_t j = 0; j < c; ++j) {
    const ew::BnAffine affine =
        ew::BnFold(gamma[j], beta[j], running_mean[j], ew::BnInvStd(running_var[j], a.eps));
    scale[j] = affine.scale;
    offset[j] = affine.shift;
  }
}

// y of m rows of c channels = x * scale + offset (then ReLU), in f32 or bf16.
template <class X, class T>
void ApplyNhwc(const BatchNormArgs& a, int64_t m, int64_t c, const X* in, const float* scale,
               const float* offset, T* out) {
  ForRowBlocks(m, c, [&](int64_t /*k*/, int64_t r0, int64_t r1) {
    RowsAffine(in, out, r0, r1, c, scale, offset, a.relu);
  });
}

// in: float, or uint16_t for bf16 (BatchNormArgs::x_bf16); out: the same for y_bf16.
template <class X, class T>
void BatchNormTrainingNhwc(const BatchNormArgs& a, int64_t m, int64_t c, const X* in,
                           const float* gamma, const float* beta, float* running_mean,
                           float* running_var, T* out, float* save_mean, float* save_invstd) {
  std::vector<float> scale(static_cast<size_t>(c)), offset(static_cast<size_t>(c));
  TrainingAffineNhwc(a, m, c, in, gamma, beta, running_mean, running_var, save_mean, save_invstd,
                     scale.data(), offset.data());
  ApplyNhwc(a, m, c, in, scale.data(), offset.data(), out);
}

template <class X, class T>
void BatchNormInferenceNhwc(const BatchNormArgs& a, int64_t m, int64_t c, const X* in,
                            const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, T* out) {
  std::vector<float> scale(static_cast<size_t>(c)), offset(static_cast<size_t>(c));
  InferenceAffine(a, c, gamma, beta, running_mean, running_var, scale.data(), offset.data());
  ApplyNhwc(a, m, c, in, scale.data(), offset.data(), out);
}

// gated: the forward folded a ReLU (its gate recomputed from x, gamma, beta and the statistics).
// g: the gradient, in one part or two (GradRows::g2). dx in f32, or dx16 in bf16 (the other null).
template <class X>
void BatchNormBackwardNhwc(int64_t m, int64_t c, const X* x, GradRows g, bool gated,
                           const float* gamma, const float* beta, const float* save_mean,
                           const float* save_invstd, float* dx, uint16_t* dx16, float* dgamma,
                           float* dbeta, bool accumulate) {
  const RowBlocks b = SplitRows(m, c);
  NhwcGradTerms t;
  t.mean.assign(save_mean, save_mean + c);
  // every array sized (RowsGrad offsets them all, used or not, for a row's chunks)
  t.a.resize(static_cast<size_t>(c));
  t.b.resize(static_cast<size_t>(c));
  t.c.resize(static_cast<size_t>(c));
  t.scale.resize(static_cast<size_t>(c));
  t.shift.resize(static_cast<size_t>(c));
  if (gated) {
    for (int64_t j = 0; j < c; ++j) {
      const ew::BnAffine affine = ew::BnFold(gamma[j], beta[j], save_mean[j], save_invstd[j]);
      t.scale[static_cast<size_t>(j)] = affine.scale;
      t.shift[static_cast<size_t>(j)] = affine.shift;
    }
  }
  std::vector<double> part(static_cast<size_t>(2 * b.count * c), 0.0);
  for (int pass = 0; pass < 2; ++pass) {
#pragma omp parallel for if (m * c > kParallelMin)
    for (int64_t k = 0; k < b.count; ++k) {
      const int64_t r0 = k * b.rows, r1 = std::min(m, (k + 1) * b.rows);
      double* s = part.data() + 2 * k * c;
      if (pass == 1 && dx16 != nullptr) {
        if (gated) {
          RowsGradGated(g, x, dx16, r0, r1, c, t);
        } else {
          RowsGradPlain(g, x, dx16, r0, r1, c, t);
        }
      } else if (gated) {
        RowsGradGated(pass, g, x, dx, r0, r1, c, t, s, s + c);
      } else {
        RowsGradPlain(pass, g, x, dx, r0, r1, c, t, s, s + c);
      }
    }
    if (pass == 1) break;
    for (int64_t j = 0; j < c; ++j) {
      const auto u = static_cast<size_t>(j);
      double sum_dy = 0, sum_dy_xc = 0;
      for (int64_t k = 0; k < b.count; ++k) {
        sum_dy += part[static_cast<size_t>(2 * k * c + j)];
        sum_dy_xc += part[static_cast<size_t>((2 * k + 1) * c + j)];
      }
      const ew::BnGradFolded f =
          ew::BnGradFold(gamma[j], save_invstd[j], static_cast<double>(m), sum_dy, sum_dy_xc);
      t.a[u] = f.dx.a, t.b[u] = f.dx.b, t.c[u] = f.dx.c;
      dgamma[j] = ew::BnParamGrad(f.sum_dy_xhat, dgamma[j], accumulate);
      dbeta[j] = ew::BnParamGrad(sum_dy, dbeta[j], accumulate);
    }
  }
}

// y's dtype (f32, or bf16 for BatchNormArgs::y_bf16) and size.
void CheckY(const BatchNormArgs& a, const Tensor& x, const Tensor& y) {
  DPT_CHECK(y.dtype() == (a.y_bf16 ? DType::kBF16 : DType::kF32))
      << "batch norm y: " << DTypeName(y.dtype()) << (a.y_bf16 ? ", bf16 wanted" : "");
  CheckSame(x, y, "batch norm y");
}

// x's dtype: f32, or bf16 for BatchNormArgs::x_bf16 (channels-last only).
void CheckX(const BatchNormArgs& a, const Tensor& x) {
  DPT_CHECK(x.dtype() == (a.x_bf16 ? DType::kBF16 : DType::kF32))
      << "batch norm x: " << DTypeName(x.dtype()) << (a.x_bf16 ? ", bf16 wanted" : "");
  DPT_CHECK(!a.x_bf16 || a.nhwc) << "batch norm of a bf16 x: channels-last only";
}

// f(x's elements) with x's pointer type: float, or uint16_t for bf16 (its dtype, as
// BatchNormArgs::x_bf16 or AffineAdd's inputs say).
template <class F>
void WithX(const Tensor& x, F f) {
  if (x.dtype() == DType::kBF16) {
    f(static_cast<const uint16_t*>(x.raw()));
  } else {
    f(x.data<float>());
  }
}

// run(x's elements, y's elements) with the pointer types BatchNormArgs::x_bf16 and y_bf16 say.
template <class F>
void Dispatch(const BatchNormArgs& a, const Tensor& x, Tensor* y, F run) {
  WithX(x, [&](const auto* i) {
    if (a.y_bf16) {
      run(i, static_cast<uint16_t*>(y->raw()));
    } else {
      run(i, y->data<float>());
    }
  });
}

}  // namespace

void CpuBackend::BatchNormForwardTraining(const BatchNormArgs& a, const Tensor& x,
                                          const Tensor& gamma, const Tensor& beta,
                                          Tensor* running_mean, Tensor* running_var, Tensor* y,
                                          Tensor* save_mean, Tensor* save_invstd) {
  OpScope scope(this, "batchnorm_fwd");
  const BatchNormDims d = BatchNormShape(x.shape());
  CheckX(a, x);
  CheckY(a, x, *y);
  const int64_t m = d.n * d.hw;
  if (a.nhwc) {
    const auto run = [&](const auto* i, auto* o) {
      BatchNormTrainingNhwc(a, m, d.c, i, gamma.data<float>(), beta.data<float>(),
                            running_mean->data<float>(), running_var->data<float>(), o,
                            save_mean->data<float>(), save_invstd->data<float>());
    };
    Dispatch(a, x, y, run);
    return;
  }
  const float* in = x.data<float>();
  float* out = a.y_bf16 ? nullptr : y->data<float>();
  auto* out16 = a.y_bf16 ? static_cast<uint16_t*>(y->raw()) : nullptr;
#pragma omp parallel for if (m * d.c > kParallelMin)
  for (int64_t c = 0; c < d.c; ++c) {
    const double shift = in[c * d.hw];
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < d.n; ++i) RunMoments(in + (i * d.c + c) * d.hw, d.hw, shift, &s1, &s2);
    const double mean = shift + s1 / static_cast<double>(m);
    const double var =
        std::max(0.0, (s2 - s1 * s1 / static_cast<double>(m)) / static_cast<double>(m));
    const double invstd = ew::BnInvStd(var, a.eps);
    const ew::BnAffine affine =
        ew::BnFold(gamma.data<float>()[c], beta.data<float>()[c], static_cast<float>(mean), invstd);
    for (int64_t i = 0; i < d.n; ++i) {
      const int64_t off = (i * d.c + c) * d.hw;
      if (a.y_bf16) {
        RunAffine(in + off, out16 + off, d.hw, affine, a.relu);
      } else {
        RunAffine(in + off, out + off, d.hw, affine, a.relu);
      }
    }
    save_mean->data<float>()[c] = static_cast<float>(mean);
    save_invstd->data<float>()[c] = static_cast<float>(invstd);
    float& rm = running_mean->data<float>()[c];
    float& rv = running_var->data<float>()[c];
    rm = ew::BnRunning(rm, mean, a.momentum);
    rv = ew::BnRunning(rv, ew::BnUnbiasedVar(var, m), a.momentum);
  }
}

void CpuBackend::BatchNormForwardInference(const BatchNormArgs& a, const Tensor& x,
                                           const Tensor& gamma, const Tensor& beta,
                                           const Tensor& running_mean, const Tensor& running_var,
                                           Tensor* y) {
  OpScope scope(this, "batchnorm_infer");
  const BatchNormDims d = BatchNormShape(x.shape());
  CheckX(a, x);
  CheckY(a, x, *y);
  if (a.nhwc) {
    const auto run = [&](const auto* i, auto* o) {
      BatchNormInferenceNhwc(a, d.n * d.hw, d.c, i, gamma.data<float>(), beta.data<float>(),
                             running_mean.data<float>(), running_var.data<float>(), o);
    };
    Dispatch(a, x, y, run);
    return;
  }
  const float* in = x.data<float>();
  float* out = a.y_bf16 ? nullptr : y->data<float>();
  auto* out16 = a.y_bf16 ? static_cast<uint16_t*>(y->raw()) : nullptr;
#pragma omp parallel for if (d.n * d.c * d.hw > kParallelMin)
  for (int64_t c = 0; c < d.c; ++c) {
    const double invstd = ew::BnInvStd(running_var.data<float>()[c], a.eps);
    const ew::BnAffine affine = ew::BnFold(gamma.data<float>()[c], beta.data<float>()[c],
                                           running_mean.data<float>()[c], invstd);
    for (int64_t i = 0; i < d.n; ++i) {
      const int64_t off = (i * d.c + c) * d.hw;
      if (a.y_bf16) {
        RunAffine(in + off, out16 + off, d.hw, affine, a.relu);
      } else {
        RunAffine(in + off, out + off, d.hw, affine, a.relu);
      }
    }
  }
}

namespace {
// An affine tensor (2 x C f32: scale, then shift) for C channels.
void CheckAffine(const Tensor& affine, int64_t c) {
  DPT_CHECK(affine.dtype() == DType::kF32 && affine.numel() == 2 * c)
      << "batch norm affine " << affine.shape().ToString() << " for " << c << " channels";
}
}  // namespace

void CpuBackend::BatchNormAffineTraining(const BatchNormArgs& a, const Tensor& x,
                                         const Tensor& gamma, const Tensor& beta,
                                         Tensor* running_mean, Tensor* running_var, Tensor* affine,
                                         Tensor* save_mean, Tensor* save_invstd) {
  OpScope scope(this, "batchnorm_fwd");
  const BatchNormDims d = BatchNormShape(x.shape());
  DPT_CHECK(a.nhwc && !a.relu && !a.y_bf16) << "batch norm applied by its reader: channels-last";
  CheckX(a, x);
  CheckAffine(*affine, d.c);
  float* af = affine->data<float>();
  WithX(x, [&](const auto* in) {
    TrainingAffineNhwc(a, d.n * d.hw, d.c, in, gamma.data<float>(), beta.data<float>(),
                       running_mean->data<float>(), running_var->data<float>(),
                       save_mean->data<float>(), save_invstd->data<float>(), af, af + d.c);
  });
}

void CpuBackend::BatchNormAffineInference(const BatchNormArgs& a, const Tensor& gamma,
                                          const Tensor& beta, const Tensor& running_mean,
                                          const Tensor& running_var, Tensor* affine) {
  OpScope scope(this, "batchnorm_infer");
  const int64_t c = gamma.numel();
  CheckAffine(*affine, c);
  float* af = affine->data<float>();
  InferenceAffine(a, c, gamma.data<float>(), beta.data<float>(), running_mean.data<float>(),
                  running_var.data<float>(), af, af + c);
}

void CpuBackend::AffineAdd(const Tensor& x0, const Tensor* affine0, const Tensor& x1,
                           const Tensor* affine1, bool relu, Tensor* y) {
  OpScope scope(this, relu ? "bn_add_relu" : "bn_add");
  // x0 and x1: f32, or bf16 where that input's batch norm reads a bf16 x (BatchNormArgs::x_bf16)
  const auto check_x = [](const Tensor& x, const Tensor* affine, const char* what) {
    DPT_CHECK(x.dtype() == DType::kF32 || (affine != nullptr && x.dtype() == DType::kBF16))
        << what << ": " << DTypeName(x.dtype()) << (affine != nullptr ? "" : " without an affine");
  };
  check_x(x0, affine0, "affine add x0");
  check_x(x1, affine1, "affine add x1");
  DPT_CHECK(y->dtype() == DType::kF32 || y->dtype() == DType::kBF16)
      << "affine add y: " << DTypeName(y->dtype());
  CheckSame(x0, x1, "affine add");
  CheckSame(x0, *y, "affine add");
  DPT_CHECK(y->raw() != x0.raw() && y->raw() != x1.raw()) << "affine add: y aliases an input";
  DPT_CHECK(x0.shape().rank() == 4) << "affine add of " << x0.shape().ToString();
  const int64_t c = x0.shape()[1], m = x0.numel() / c;
  const auto terms = [&](const Tensor* affine) -> const float* {
    if (affine == nullptr) return nullptr;
    CheckAffine(*affine, c);
    return affine->data<float>();
  };
  const float* s0 = terms(affine0);
  const float* s1 = terms(affine1);
  DPT_CHECK(s0 != nullptr || s1 != nullptr) << "affine add without an affine: Add";
  const float* t0 = s0 != nullptr ? s0 + c : nullptr;
  const float* t1 = s1 != nullptr ? s1 + c : nullptr;
  const auto run = [&](auto* out) {
    WithX(x0, [&](const auto* p0) {
      WithX(x1, [&](const auto* p1) {
        ForRowBlocks(m, c, [&](int64_t /*k*/, int64_t r0, int64_t r1) {
          RowsAffineAdd(p0, s0, t0, p1, s1, t1, out, r0, r1, c, relu);
        });
      });
    });
  };
  if (y->dtype() == DType::kBF16) {
    run(static_cast<uint16_t*>(y->raw()));
  } else {
    run(y->data<float>());
  }
}

void CpuBackend::BatchNormBackward(const BatchNormArgs& a, const Tensor& x, const Tensor& dy,
                                   const Tensor* relu_y, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& save_mean, const Tensor& save_invstd, Tensor* dx,
                                   Tensor* dgamma, Tensor* dbeta, bool accumulate) {
  OpScope scope(this, "batchnorm_bwd");
  BatchNormGrad(a, x, dy, nullptr, relu_y, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta,
                accumulate);
}

void CpuBackend::BatchNormBackwardSum(const BatchNormArgs& a, const Tensor& x, const Tensor& dy_a,
                                      const Tensor& dy_b, const Tensor* relu_y, const Tensor& gamma,
                                      const Tensor& beta, const Tensor& save_mean,
                                      const Tensor& save_invstd, Tensor* dx, Tensor* dgamma,
                                      Tensor* dbeta, bool accumulate) {
  OpScope scope(this, "batchnorm_bwd");
  DPT_CHECK(a.nhwc) << "batch norm backward of a gradient in two parts: channels-last only";
  CheckSame(dy_a, dy_b, "batch norm backward (gradient parts)");
  BatchNormGrad(a, x, dy_a, &dy_b, relu_y, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta,
                accumulate);
}

void CpuBackend::BatchNormGrad(const BatchNormArgs& a, const Tensor& x, const Tensor& dy,
                               const Tensor* dy2, const Tensor* relu_y, const Tensor& gamma,
                               const Tensor& beta, const Tensor& save_mean,
                               const Tensor& save_invstd, Tensor* dx, Tensor* dgamma, Tensor* dbeta,
                               bool accumulate) {
  const BatchNormDims d = BatchNormShape(x.shape());
  // With the folded ReLU, relu_y's values are not read: the gate comes from x (see RunGatedGrad*).
  const bool gated = relu_y != nullptr;
  if (gated) CheckSame(x, *relu_y, "batch norm backward (relu output)");
  CheckX(a, x);
  const float* g = dy.data<float>();
  const float* gm = gamma.data<float>();
  const float* bt = beta.data<float>();
  const float* sm = save_mean.data<float>();
  const float* si = save_invstd.data<float>();
  DPT_CHECK(dx->dtype() == (a.dx_bf16 ? DType::kBF16 : DType::kF32))
      << "batch norm dx: " << DTypeName(dx->dtype()) << (a.dx_bf16 ? ", bf16 wanted" : "");
  float* out = a.dx_bf16 ? nullptr : dx->data<float>();
  auto* out16 = a.dx_bf16 ? static_cast<uint16_t*>(dx->raw()) : nullptr;
  if (a.nhwc) {
    const GradRows rows{g, dy2 != nullptr ? dy2->data<float>() : nullptr};
    WithX(x, [&](const auto* in) {
      BatchNormBackwardNhwc(d.n * d.hw, d.c, in, rows, gated, gm, bt, sm, si, out, out16,
                            dgamma->data<float>(), dbeta->data<float>(), accumulate);
    });
    return;
  }
  const float* in = x.data<float>();
  DPT_CHECK(dy2 == nullptr) << "batch norm backward of a gradient in two parts: NCHW";
  const double m = static_cast<double>(d.n * d.hw);
#pragma omp parallel for if (d.n * d.c * d.hw > kParallelMin)
  for (int64_t c = 0; c < d.c; ++c) {
    BnGradTerms t{};
    t.mean = sm[c];
    const ew::BnAffine affine = ew::BnFold(gm[c], bt[c], sm[c], si[c]);
    for (int64_t i = 0; i < d.n; ++i) {
      const int64_t off = (i * d.c + c) * d.hw;
      if (gated) {
        RunGatedGradSums(g + off, affine, in + off, d.hw, &t);
      } else {
        RunGradSums(g + off, in + off, d.hw, &t);
      }
    }
    const ew::BnGradFolded f = ew::BnGradFold(gm[c], si[c], m, t.sum_dy, t.sum_dy_xc);
    t.dx = f.dx;
    for (int64_t i = 0; i < d.n; ++i) {
      const int64_t off = (i * d.c + c) * d.hw;
      if (a.dx_bf16) {
        if (gated) {
          RunGatedGradInput(g + off, affine, in + off, out16 + off, d.hw, t);
        } else {
          RunGradInput(g + off, in + off, out16 + off, d.hw, t);
        }
      } else if (gated) {
        RunGatedGradInput(g + off, affine, in + off, out + off, d.hw, t);
      } else {
        RunGradInput(g + off, in + off, out + off, d.hw, t);
      }
    }
    float& dgc = dgamma->data<float>()[c];
    float& dbc = dbeta->data<float>()[c];
    dgc = ew::BnParamGrad(f.sum_dy_xhat, dgc, accumulate);
    dbc = ew::BnParamGrad(t.sum_dy, dbc, accumulate);
  }
}

// ---- losses ------------------------------------------------------------------------------

void CpuBackend::SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels,
                                     float label_smoothing, Tensor* probs, Tensor* loss_sum,
                                     Tensor* correct) {
  OpScope scope(this, "softmax_xent");
  DPT_CHECK(logits.shape().rank() == 2) << "logits " << logits.shape().ToString();
  const int64_t n = logits.shape()[0], k = logits.shape()[1];
  DPT_CHECK(labels.numel() == n && labels.dtype() == DType::kI32) << "labels for " << n;
  const float* x = logits.data<float>();
  const int32_t* y = labels.data<int32_t>();
  float* pr = probs->data<float>();
  double loss = 0;
  int64_t hits = 0, bad = -1;
#pragma omp parallel for reduction(+ : loss, hits) if (n * k > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x + i * k;
    float mx = row[0];
    int64_t arg = 0;
    for (int64_t j = 1; j < k; ++j) {
      if (row[j] > mx) {
        mx = row[j];
        arg = j;
      }
    }
    double sum = 0, shifted = 0;
    for (int64_t j = 0; j < k; ++j) {
      sum += std::exp(static_cast<double>(row[j] - mx));
      shifted += static_cast<double>(row[j] - mx);
    }
    const double inv = 1.0 / sum;
    for (int64_t j = 0; j < k; ++j) {
      pr[i * k + j] = static_cast<float>(std::exp(static_cast<double>(row[j] - mx)) * inv);
    }
    const int32_t t = y[i];
    if (t < 0 || t >= k) {
#pragma omp critical
      bad = i;
      continue;
    }
    loss += ew::SoftmaxXentRow(std::log(sum), static_cast<double>(row[t] - mx),
                               shifted / static_cast<double>(k), label_smoothing);
    hits += arg == t ? 1 : 0;
  }
  if (bad >= 0) {
    DPT_THROW(DataError) << "label " << y[bad] << " of sample " << bad
                         << " in the batch is outside [0, " << k << ")";
  }
  loss_sum->data<float>()[0] = static_cast<float>(loss);
  if (correct != nullptr) correct->data<float>()[0] = static_cast<float>(hits);
}

void CpuBackend::SoftmaxCrossEntropyBackward(const Tensor& probs, const Tensor& labels,
                                             float label_smoothing, float scale, Tensor* dlogits) {
  OpScope scope(this, "softmax_xent_bwd");
  const int64_t n = probs.shape()[0], k = probs.shape()[1];
  const float* pr = probs.data<float>();
  const int32_t* y = labels.data<int32_t>();
  float* out = dlogits->data<float>();
#pragma omp parallel for if (n * k > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      out[i * k + j] = ew::SoftmaxXentGrad(pr[i * k + j], j == y[i], label_smoothing, k, scale);
    }
  }
}

void CpuBackend::MseLoss(const Tensor& y, const Tensor& t, Tensor* loss_sum) {
  OpScope scope(this, "mse");
  CheckSame(y, t, "mse");
  const float* a = y.data<float>();
  const float* b = t.data<float>();
  const int64_t n = y.numel();
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) sum += ew::SquaredError(a[i], b[i]);
  loss_sum->data<float>()[0] = static_cast<float>(sum);
}

void CpuBackend::MseBackward(const Tensor& y, const Tensor& t, float scale, Tensor* dy) {
  OpScope scope(this, "mse_bwd");
  CheckSame(y, t, "mse backward");
  const float* a = y.data<float>();
  const float* b = t.data<float>();
  float* out = dy->data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = ew::MseGrad(a[i], b[i], scale);
}

}  // namespace dptrain::cpu
