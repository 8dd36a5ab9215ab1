// SPDX-License-Identifier: Apache-2.0
// CPU backend: a first layer's convolution, its ReLU and the 2x2 max pool after them as one op
// (ConvPoolDesc). With one to four input channels a convolution does little arithmetic per output
// value, and oneDNN's kernels spend their time writing the full-size output that the pool reads
// back, then the pool's scattered gradient (3 zeros in 4) that the weight gradient reads: ref_cnn
// at batch 64 moves 6.4 MB in each of those passes, and they took a quarter of its step. Here
// each pooled value is the maximum of its window's four convolution outputs, computed side by
// side and never stored, and the weight gradient reads only the pooled gradient and the window
// position of each maximum. Unlike the rest of core/, this file compiles with -ffp-contract=fast
// (core/CMakeLists.txt): its AVX-512 and AVX2 clones fuse each multiply-add, as oneDNN's kernels
// do (ref_cnn's forward on one thread 0.230 -> 0.179 ms at batch 64; the baseline build has no
// FMA and rounds each product). In bf16 every product is exact: the same bits either way.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12 warns that its own intrinsics' undefined operands are (or may be) used uninitialized
// (gcc.gnu.org/PR105593); they are not.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_backend_impl.h"
#include "core/elementwise.h"
#include "core/error.h"

namespace dptrain::cpu {
namespace {

constexpr int64_t kLanes = 16;     // output channels per step: one AVX-512 register of floats
constexpr int64_t kMaxKernel = 7;  // the largest kernel fused (rows and columns): see Supports

// How the kernels see the op: the input zero-padded (hp rows of xs per channel, one sample at a
// time) and the weights as taps (c, r, s) of kp output channels each (K rounded up to kLanes,
// zeros after K), so each tap's weights for a step of kLanes channels are contiguous.
struct Geometry {
  int64_t c, k, kp, r, s, taps, hp, wp, ph, pw;
  int64_t xs;  // row stride of the padded input: wp and two zeros (a pair's idle second column)
  bool x_nhwc, y_nhwc, bf16;
};

Geometry Describe(const ConvPoolDesc& d) {
  const Conv2dDesc& c = d.conv;
  Geometry g{};
  g.c = c.c, g.k = c.k, g.kp = (c.k + kLanes - 1) / kLanes * kLanes, g.r = c.r, g.s = c.s;
  g.taps = c.c * c.r * c.s;
  g.hp = c.h + 2 * c.pad, g.wp = c.w + 2 * c.pad, g.xs = g.wp + 2;
  g.ph = d.pool.out_h(), g.pw = d.pool.out_w();
  g.x_nhwc = c.x_nhwc, g.y_nhwc = d.pool.nhwc, g.bf16 = c.precision == Precision::kBF16;
  return g;
}

// bf16 precision computes on bf16 operands with f32 sums, as oneDNN's bf16 kernels: rounded to
// bf16 here, every product is exact in f32.
float Operand(float v, bool bf16) { return bf16 ? ew::Bf16ToFloat(ew::FloatToBf16(v)) : v; }

// The padded sample's floats: g.c planes of hp rows of xs, and zeros for the backward's 16-wide
// row loads (AddTap's rows) to read past the last row.
int64_t PaddedSize(const Geometry& g) { return g.c * g.hp * g.xs + kLanes; }

// Rounds n floats to their bf16 operands in place (Operand(v, true) of each; zeros stay zeros).
DPT_SIMD_CLONES void RoundToOperands(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(Bf16Bits(v[i])) << 16;
    std::memcpy(&v[i], &bits, sizeof(float));
  }
}

// Sample n of x into xp (g.c planes of hp x wp, zeros around): each row of a plane is one run of
// x (channels-first, or one channel) or every g.c-th value of one, then the bf16 operands
// rounded over the whole buffer at once. Per element with its index computed, this took as long
// as the convolution of one input channel itself.
void PadSample(const Geometry& g, const Conv2dDesc& d, const float* x, int64_t n, float* xp) {
  std::fill(xp, xp + PaddedSize(g), 0.f);
  const int64_t step = g.x_nhwc ? g.c : 1;  // between a row's pixels in x
  for (int64_t c = 0; c < g.c; ++c) {
    const float* plane = g.x_nhwc ? x + n * d.h * d.w * g.c + c : x + (n * g.c + c) * d.h * d.w;
    for (int64_t h = 0; h < d.h; ++h) {
      const float* src = plane + h * d.w * step;
      float* row = xp + (c * g.hp + h + d.pad) * g.xs + d.pad;
      if (step == 1) {
        std::copy_n(src, d.w, row);
      } else {
        for (int64_t w = 0; w < d.w; ++w) row[w] = src[w * step];
      }
    }
  }
  if (g.bf16) RoundToOperands(xp, PaddedSize(g));
}

// A step of kLanes output channels as one vector (GCC's vector extension: AVX-512 in the clone
// built for it, several narrower registers in the others), so the four window positions' sums
// stay in registers. Values move in and out through memcpy; no vector crosses a call (the helpers
// that take or return vectors are always_inline; the per-lane fallbacks take arrays).
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using Mask = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
using Bytes = uint8_t __attribute__((vector_size(kLanes)));
constexpr int32_t kPassed = 4;  // ws's bit for an output the ReLU passed (see StorePooled)

// Operand(v, true) of every lane: ew::FloatToBf16's rounding (to nearest even, NaN kept quiet)
// on the bits, then back to f32. Inlined, so no vector crosses a call.
[[gnu::always_inline]] inline void RoundOperands(Vec* v) {
  using Bits = uint32_t __attribute__((vector_size(kLanes * sizeof(uint32_t))));
  Bits u;
  std::memcpy(&u, v, sizeof(Vec));
  const Bits nan = (u & 0x7fffffffu) > 0x7f800000u;
  const Bits rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const Bits quiet = (u & 0xffff0000u) | 0x400000u;
  u = (nan & quiet) | (~nan & rounded);
  std::memcpy(v, &u, sizeof(Vec));
}

// The pooled elements (i, j, channels k0..k0+kLanes) of sample n: their offsets in y, dy and ws
// (lanes past K get none: `lanes` of them are real).
struct Step {
  int64_t at[kLanes];
  int64_t lanes;
  bool contiguous;  // channels-last: at[l] = at[0] + l (only at[0] is set)
};
void Locate(const Geometry& g, int64_t n, int64_t i, int64_t j, int64_t k0, Step* st) {
  st->lanes = std::min(kLanes, g.k - k0);
  st->contiguous = g.y_nhwc;
  if (g.y_nhwc) {
    st->at[0] = ((n * g.ph + i) * g.pw + j) * g.k + k0;
    return;
  }
  for (int64_t l = 0; l < st->lanes; ++l) {
    const int64_t kk = k0 + l;
    st->at[l] = ((n * g.k + kk) * g.ph + i) * g.pw + j;
  }
}

// A pooled step's lanes one by one (channels-first, or the last step of K channels): outside the
// kernels, so that their stores are not compiled (and partly run) into every full step.
[[gnu::noinline]] void StoreLanes(const Step& st, const float* m, const uint8_t* pos, float* y,
                                  uint8_t* ws) {
  for (int64_t l = 0; l < st.lanes; ++l) {
    const int64_t o = st.contiguous ? st.at[0] + l : st.at[l];
    y[o] = m[l];
    if (ws != nullptr) ws[o] = pos[l];
  }
}

// Stores one pooled step: the maximum over the window positions q[0..3] after the ReLU, and the
// position it came from (the first holding it wins, as the pool's scan) when ws is set, with
// kPassed added where the ReLU passed it (the output is positive): the backward reads its gate
// there and not from y, a third of the bytes it would read.
[[gnu::always_inline]] inline void StorePooled(const Geometry& g, int64_t n, int64_t i, int64_t j,
                                               int64_t k0, const Vec* q, float* y, uint8_t* ws) {
  Vec m = q[0];
  Mask p = Mask{} + 0;
  for (int32_t pos = 1; pos < 4; ++pos) {
    const Mask up = q[pos] > m;
    m = up ? q[pos] : m;
    p = up ? Mask{} + pos : p;
  }
  const Mask on = m > 0.f;  // the ReLU (ew::Relu), its gate kept in the position's bit 2
  m = on ? m : Vec{};
  p |= on & kPassed;
  const Bytes pb = __builtin_convertvector(p, Bytes);
  Step st;
  Locate(g, n, i, j, k0, &st);
  if (st.contiguous && st.lanes == kLanes) {  // a full channels-last step: two vector stores
    std::memcpy(y + st.at[0], &m, sizeof(Vec));
    if (ws != nullptr) std::memcpy(ws + st.at[0], &pb, sizeof(Bytes));
    return;
  }
  float ml[kLanes];
  uint8_t pl[kLanes];
  std::memcpy(ml, &m, sizeof(Vec));
  std::memcpy(pl, &pb, sizeof(Bytes));
  StoreLanes(st, ml, pl, y, ws);
}

// kP pooled columns (j..j + kP - 1) of row i, every step of channels: 4 * kP independent sums
// per step (the adds' latency hides behind them), each lane summing bias, then the taps in
// (c, r, s) order; a column past the row computes an idle sum over the zeros after it. kR x kS
// > 0 fixes the kernel's size at compile time (the taps unrolled); 0 reads it from g.
template <int64_t kR, int64_t kS, int64_t kP>
[[gnu::always_inline]] inline void ForwardColumns(const Geometry& g, const float* xp,
                                                  const float* wt, const float* bias, int64_t n,
                                                  int64_t i, int64_t j, float* y, uint8_t* ws) {
  const int64_t rows = kR > 0 ? kR : g.r, cols = kS > 0 ? kS : g.s;
  for (int64_t k0 = 0; k0 < g.kp; k0 += kLanes) {
    Vec a[4 * kP];
    std::memcpy(&a[0], bias + k0, sizeof(Vec));
    for (auto& v : a) v = a[0];
    for (int64_t c = 0; c < g.c; ++c) {
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = xp + (c * g.hp + 2 * i + r) * g.xs + 2 * j;
        const float* wv = wt + ((c * rows + r) * cols) * g.kp + k0;
        for (int64_t s = 0; s < cols; ++s, wv += g.kp) {
          Vec w;
          std::memcpy(&w, wv, sizeof(Vec));
          const float* top = row + s;
          const float* bottom = top + g.xs;
#pragma GCC unroll 4
          for (int64_t p = 0; p < kP; ++p) {
            a[4 * p] += top[2 * p] * w;
            a[4 * p + 1] += top[2 * p + 1] * w;
            a[4 * p + 2] += bottom[2 * p] * w;
            a[4 * p + 3] += bottom[2 * p + 1] * w;
          }
        }
      }
    }
#pragma GCC unroll 4
    for (int64_t p = 0; p < kP; ++p) {
      if (j + p < g.pw) StorePooled(g, n, i, j + p, k0, a + 4 * p, y, ws);
    }
  }
}

// One sample's pooled outputs: three pooled columns at a time (twelve sums), the last one or two
// as a pair.
template <int64_t kR, int64_t kS>
[[gnu::always_inline]] inline void ForwardBody(const Geometry& geo, const float* xp,
                                               const float* wt, const float* bias, int64_t n,
                                               float* y, uint8_t* ws) {
  const Geometry g = geo;  // a copy: no store through y can change it, so it stays in registers
  for (int64_t i = 0; i < g.ph; ++i) {
    int64_t j = 0;
    for (; j + 3 <= g.pw; j += 3) ForwardColumns<kR, kS, 3>(g, xp, wt, bias, n, i, j, y, ws);
    if (j < g.pw) ForwardColumns<kR, kS, 2>(g, xp, wt, bias, n, i, j, y, ws);
  }
}

// The window positions of a step as 32-bit lanes. Through 16 bits: GCC 12 converts bytes to 32
// bits directly one lane at a time, through general registers.
[[gnu::always_inline]] inline void Widen(Bytes b, Mask* m) {
  using Halves = uint16_t __attribute__((vector_size(kLanes * sizeof(uint16_t))));
  *m = __builtin_convertvector(__builtin_convertvector(b, Halves), Mask);
}

// A pooled step's gradient and window positions lane by lane (channels-first, or the last step of
// K channels), zeros past its lanes: outside the kernels, as StoreLanes.
[[gnu::noinline]] void LoadLanes(const Geometry& g, const Step& st, const float* dy,
                                 const uint8_t* ws, float* gl, int32_t* al) {
  for (int64_t l = 0; l < kLanes; ++l) gl[l] = 0.f, al[l] = 0;
  for (int64_t l = 0; l < st.lanes; ++l) {
    const int64_t o = st.contiguous ? st.at[0] + l : st.at[l];
    gl[l] = Operand(dy[o], g.bf16), al[l] = ws[o];
  }
}

// The gradient of one pooled step, two columns (j, j + 1) of channels k0..: dy gated by the ReLU
// (ws's kPassed) in gv[col], the window position the maximum came from in at[col] (zeros for a
// column past the row); their sum added to db_sum.
[[gnu::always_inline]] inline void PooledGradient(const Geometry& g, const float* dy,
                                                  const uint8_t* ws, int64_t n, int64_t i,
                                                  int64_t j, int64_t k0, Vec* gv, Mask* at,
                                                  Vec* db_sum) {
  for (int64_t col = 0; col < 2; ++col) {
    Vec gc{};
    Mask ac{};
    if (j + col < g.pw) {
      Step st;
      Locate(g, n, i, j + col, k0, &st);
      if (st.contiguous && st.lanes == kLanes) {
        // Channels-last, a full step: two vector loads (a copy through per-lane arrays stalled
        // store forwarding on every vector: a third of the op's time).
        Bytes ab;
        std::memcpy(&gc, dy + st.at[0], sizeof(Vec));
        std::memcpy(&ab, ws + st.at[0], sizeof(Bytes));
        Widen(ab, &ac);
        if (g.bf16) RoundOperands(&gc);
      } else {
        float gl[kLanes];
        int32_t al[kLanes];
        LoadLanes(g, st, dy, ws, gl, al);
        std::memcpy(&gc, gl, sizeof(Vec));
        std::memcpy(&ac, al, sizeof(Mask));
      }
    }
    gv[col] = (ac & kPassed) != 0 ? gc : Vec{};
    at[col] = ac & (kPassed - 1);
    *db_sum += gv[col];
  }
}

// Adds one tap's gradient terms to its sum: each column's gradient times the input under the tap
// at the window position its maximum came from, column 0's term first (the other three
// positions' terms are zeros: the pool's gradient is zero there, so adding them would not change
// the sum). top and bottom are the tap row's two input rows from the pair's first column, 16
// values each; base[col] is lane by lane where col's maximum lies in them, 16 * row + column,
// before the tap's column s. One two-register permute (vpermt2ps in GCC's AVX-512 clone) per
// column picks the inputs; clang (the lint and fuzz builds) has no shuffle with lanes known only
// at run time, so a lane loop there.
[[gnu::always_inline]] inline void AddTap(const Vec& top, const Vec& bottom, const Mask* base,
                                          int64_t s, const Vec* gv, Vec* sum) {
  Vec x[2];
  for (int64_t col = 0; col < 2; ++col) {
    const Mask idx = base[col] + static_cast<int32_t>(s);
#if defined(__clang__)
    for (int64_t l = 0; l < kLanes; ++l) {
      x[col][l] = idx[l] < kLanes ? top[idx[l]] : bottom[idx[l] - kLanes];
    }
#else
    x[col] = __builtin_shuffle(top, bottom, idx);
#endif
  }
  *sum += gv[0] * x[0];
  *sum += gv[1] * x[1];
}

// One sample's weight and bias gradients, (taps, kp) and (kp), added in f32 to dw and db over its
// pooled positions in (i, j) order, two columns at a time. For each pooled row, step
// of channels and input channel, the kernel's r * s sums stay local over the row; the row's
// gradient and window positions (cold in training) are read from memory once, the second
// step of channels finding them in cache (a step over the whole sample at a time took 1.6x as
// long at batch 256). A fixed kR x kS kernel unrolls the taps, which keeps the sums in registers
// (GCC leaves such short loops rolled, and the sums would live in memory); 0: the size from g.
template <int64_t kR, int64_t kS>
[[gnu::always_inline]] inline void BackwardBody(const Geometry& geo, const float* xp,
                                                const float* dy, const uint8_t* ws, int64_t n,
                                                float* dw, float* db) {
  const Geometry g = geo;  // as in ForwardBody
  const int64_t rows = kR > 0 ? kR : g.r, cols = kS > 0 ? kS : g.s, taps = rows * cols;
  for (int64_t i = 0; i < g.ph; ++i) {
    for (int64_t k0 = 0; k0 < g.kp; k0 += kLanes) {
      for (int64_t c = 0; c < g.c; ++c) {
        Vec db_sum, sums[kR > 0 ? kR * kS : kMaxKernel * kMaxKernel];
        std::memcpy(&db_sum, db + k0, sizeof(Vec));
        for (int64_t t = 0; t < taps; ++t)
          std::memcpy(&sums[t], dw + (c * taps + t) * g.kp + k0, sizeof(Vec));
        for (int64_t j = 0; j < g.pw; j += 2) {
          Vec gv[2];
          Mask at[2];
          PooledGradient(g, dy, ws, n, i, j, k0, gv, at, &db_sum);
          const Mask base[2] = {(at[0] >> 1) * kLanes + (at[0] & 1),
                                (at[1] >> 1) * kLanes + (at[1] & 1) + 2};
#pragma GCC unroll 8
          for (int64_t r = 0; r < rows; ++r) {
            const float* row = xp + (c * g.hp + 2 * i + r) * g.xs + 2 * j;
            Vec top, bottom;
            std::memcpy(&top, row, sizeof(Vec));
            std::memcpy(&bottom, row + g.xs, sizeof(Vec));
#pragma GCC unroll 8
            for (int64_t s = 0; s < cols; ++s)
              AddTap(top, bottom, base, s, gv, &sums[r * cols + s]);
          }
        }
        for (int64_t t = 0; t < taps; ++t)
          std::memcpy(dw + (c * taps + t) * g.kp + k0, &sums[t], sizeof(Vec));
        if (c == 0) std::memcpy(db + k0, &db_sum, sizeof(Vec));
      }
    }
  }
}

#if defined(__x86_64__)
#define DPT_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

// One pooled column's gradient for channels k0..k0 + 15 of a channels-last dy: gated by the
// ReLU (ws's kPassed) in *gv, and where in the pair's two input rows its window's maximum lies,
// 16 * row + column (+ shift: 2 for the pair's second column), in *base; the gated gradient
// added to *db.
DPT_AVX512 inline void PooledGradient512(const float* dy, const uint8_t* ws, bool bf16,
                                         int32_t shift, __m512* gv, __m512i* base, __m512* db) {
  const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws)));
  __m512 gc = _mm512_loadu_ps(dy);
  if (bf16) {
    Vec v;
    std::memcpy(&v, &gc, sizeof(v));
    RoundOperands(&v);
    std::memcpy(&gc, &v, sizeof(v));
  }
  *gv = _mm512_maskz_mov_ps(_mm512_test_epi32_mask(a, _mm512_set1_epi32(kPassed)), gc);
  // (a >> 1 & 1) * 16 + (a & 1) + shift
  const __m512i row = _mm512_slli_epi32(_mm512_and_si512(a, _mm512_set1_epi32(2)), 3);
  *base = _mm512_add_epi32(_mm512_or_si512(row, _mm512_and_si512(a, _mm512_set1_epi32(1))),
                           _mm512_set1_epi32(shift));
  *db = _mm512_add_ps(*db, *gv);
}

// BackwardBody for a channels-last dy with K a multiple of 16 (every step full and contiguous)
// on AVX-512, the same sums in the same order (one fused multiply-add per term, as the clone
// compiled with -ffp-contract=fast). Written with intrinsics: GCC 12 kept BackwardBody's vectors
// in memory across its window-position arithmetic and offset computations (ref_cnn's weight
// gradient on one thread ran at 35% of the FMA peak there).
template <int kR, int kS>
DPT_AVX512 void BackwardNhwc512(const Geometry& geo, const float* xp, const float* dy,
                                const uint8_t* ws, int64_t n, float* dw, float* db) {
  const Geometry g = geo;
  constexpr int kTaps = kR * kS;
  for (int64_t i = 0; i < g.ph; ++i) {
    const int64_t row0 = ((n * g.ph + i) * g.pw) * g.k;  // (n, i, 0, 0) in dy and ws
    for (int64_t k0 = 0; k0 < g.k; k0 += kLanes) {
      for (int64_t c = 0; c < g.c; ++c) {
        __m512 sums[kTaps];
        __m512 db_sum = _mm512_loadu_ps(db + k0);
        for (int t = 0; t < kTaps; ++t) sums[t] = _mm512_loadu_ps(dw + (c * kTaps + t) * g.kp + k0);
        for (int64_t j = 0; j < g.pw; j += 2) {
          const int64_t o = row0 + j * g.k + k0;
          __m512 g0, g1 = _mm512_setzero_ps();
          __m512i b0, b1 = _mm512_set1_epi32(2);
          PooledGradient512(dy + o, ws + o, g.bf16, 0, &g0, &b0, &db_sum);
          if (j + 1 < g.pw)
            PooledGradient512(dy + o + g.k, ws + o + g.k, g.bf16, 2, &g1, &b1, &db_sum);
          const float* rows = xp + (c * g.hp + 2 * i) * g.xs + 2 * j;
#pragma GCC unroll 8
          for (int r = 0; r < kR; ++r) {
            const __m512 top = _mm512_loadu_ps(rows + r * g.xs);
            const __m512 bottom = _mm512_loadu_ps(rows + (r + 1) * g.xs);
#pragma GCC unroll 8
            for (int s = 0; s < kS; ++s) {
              const __m512i step = _mm512_set1_epi32(s);
              const __m512 x0 = _mm512_permutex2var_ps(top, _mm512_add_epi32(b0, step), bottom);
              const __m512 x1 = _mm512_permutex2var_ps(top, _mm512_add_epi32(b1, step), bottom);
              sums[r * kS + s] = _mm512_fmadd_ps(g0, x0, sums[r * kS + s]);
              sums[r * kS + s] = _mm512_fmadd_ps(g1, x1, sums[r * kS + s]);
            }
          }
        }
        for (int t = 0; t < kTaps; ++t) _mm512_storeu_ps(dw + (c * kTaps + t) * g.kp + k0, sums[t]);
        if (c == 0) _mm512_storeu_ps(db + k0, db_sum);
      }
    }
  }
}

// Whether BackwardNhwc512 runs g: an AVX-512 CPU, a channels-last dy with every step full, and
// a 3x3 or 5x5 kernel.
bool Backward512(const Geometry& g) {
  static const bool avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return avx512 && g.y_nhwc && g.k % kLanes == 0 &&
         ((g.r == 3 && g.s == 3) || (g.r == 5 && g.s == 5));
}
#endif

// The kernels, compiled for each CPU kind: 3x3 and 5x5 kernels fixed, any other read from g.
DPT_SIMD_CLONES void ForwardSample(const Geometry& g, const float* xp, const float* wt,
                                   const float* bias, int64_t n, float* y, uint8_t* ws) {
  if (g.r == 3 && g.s == 3) return ForwardBody<3, 3>(g, xp, wt, bias, n, y, ws);
  if (g.r == 5 && g.s == 5) return ForwardBody<5, 5>(g, xp, wt, bias, n, y, ws);
  ForwardBody<0, 0>(g, xp, wt, bias, n, y, ws);
}
DPT_SIMD_CLONES void BackwardSample(const Geometry& g, const float* xp, const float* dy,
                                    const uint8_t* ws, int64_t n, float* dw, float* db) {
#if defined(__x86_64__)
  if (Backward512(g)) {
    if (g.r == 3) return BackwardNhwc512<3, 3>(g, xp, dy, ws, n, dw, db);
    return BackwardNhwc512<5, 5>(g, xp, dy, ws, n, dw, db);
  }
#endif
  if (g.r == 3 && g.s == 3) return BackwardBody<3, 3>(g, xp, dy, ws, n, dw, db);
  if (g.r == 5 && g.s == 5) return BackwardBody<5, 5>(g, xp, dy, ws, n, dw, db);
  BackwardBody<0, 0>(g, xp, dy, ws, n, dw, db);
}

}  // namespace

bool CpuBackend::Supports(const ConvPoolDesc& d) const {
  // A larger kernel is no first layer's and would not keep its sums local: it runs unfused.
  return fusions_ && d.Valid() && d.conv.r <= kMaxKernel && d.conv.s <= kMaxKernel &&
         d.conv.precision != Precision::kF16 && PrecisionOk(d.conv.precision);
}

void CpuBackend::ConvPoolForward(const ConvPoolDesc& d, const Tensor& x, const Tensor& w,
                                 const Tensor* b, Tensor* y, Tensor* ws) {
  OpScope scope(this, "conv_pool_fwd");
  DPT_CHECK(Supports(d)) << "cpu: fused " << d.ToString();
  const Conv2dDesc& cd = d.conv;
  scope.set_flops(cd.flops());
  CheckF32(x, "conv_pool x");
  DPT_CHECK(x.numel() == cd.n * cd.c * cd.h * cd.w && w.numel() == cd.weight_numel() &&
            y->numel() == cd.n * cd.k * d.pool.out_h() * d.pool.out_w() &&
            (ws == nullptr || ws->bytes() >= static_cast<size_t>(y->numel())) &&
            (!cd.bias || b != nullptr))
      << "conv_pool operands for " << d.ToString();
  const Geometry g = Describe(d);
  // Weights as (taps, kp), bias as (kp): zeros past K, so the last step's idle lanes compute 0.
  std::vector<float> wt(static_cast<size_t>(g.taps * g.kp), 0.f), bias(static_cast<size_t>(g.kp));
  const float* wp = w.data<float>();
  for (int64_t k = 0; k < g.k; ++k) {
    for (int64_t t = 0; t < g.taps; ++t) wt[t * g.kp + k] = Operand(wp[k * g.taps + t], g.bf16);
    bias[k] = cd.bias ? b->data<float>()[k] : 0.f;
  }
  const float* xs = x.data<float>();
  float* out = y->data<float>();
  uint8_t* at = ws != nullptr ? ws->data<uint8_t>() : nullptr;
#pragma omp parallel
  {
    std::vector<float> xp(static_cast<size_t>(PaddedSize(g)));
#pragma omp for
    for (int64_t n = 0; n < cd.n; ++n) {
      PadSample(g, cd, xs, n, xp.data());
      ForwardSample(g, xp.data(), wt.data(), bias.data(), n, out, at);
    }
  }
}

void CpuBackend::ConvPoolBackward(const ConvPoolDesc& d, const Tensor& x, const Tensor& y,
                                  const Tensor& dy, const Tensor& ws, Tensor* dw, Tensor* db,
                                  bool accumulate) {
  OpScope scope(this, "conv_pool_bwd");
  DPT_CHECK(Supports(d)) << "cpu: fused " << d.ToString();
  const Conv2dDesc& cd = d.conv;
  scope.set_flops(cd.flops());
  const Geometry g = Describe(d);
  DPT_CHECK(dy.numel() == y.numel() && ws.bytes() >= static_cast<size_t>(y.numel()) &&
            dw->numel() == cd.weight_numel() && (!cd.bias || db != nullptr))
      << "conv_pool backward operands for " << d.ToString();
  // Each sample's sums in f32 (its pooled positions), added in double into one partial per block
  // of samples, the blocks added in order: the same bits on any number of threads, and as
  // accurate as oneDNN's blocked sums (the 1 vs N rank equivalence tests compare them).
  constexpr int64_t kBlock = 8;
  const int64_t blocks = (cd.n + kBlock - 1) / kBlock, part = g.taps * g.kp + g.kp;
  std::vector<double> parts(static_cast<size_t>(blocks * part), 0.0);
  const float* xs = x.data<float>();
#pragma omp parallel
  {
    std::vector<float> xp(static_cast<size_t>(PaddedSize(g))), one(static_cast<size_t>(part));
#pragma omp for
    for (int64_t blk = 0; blk < blocks; ++blk) {
      double* p = parts.data() + blk * part;
      for (int64_t n = blk * kBlock; n < std::min(cd.n, (blk + 1) * kBlock); ++n) {
        PadSample(g, cd, xs, n, xp.data());
        std::fill(one.begin(), one.end(), 0.f);
        BackwardSample(g, xp.data(), dy.data<float>(), ws.data<uint8_t>(), n, one.data(),
                       one.data() + g.taps * g.kp);
        for (int64_t t = 0; t < part; ++t) p[t] += one[static_cast<size_t>(t)];
      }
    }
  }
  float* gw = dw->data<float>();
  for (int64_t k = 0; k < g.k; ++k) {
    for (int64_t t = 0; t < g.taps; ++t) {
      double sum = 0;
      for (int64_t b = 0; b < blocks; ++b)
        sum += parts[static_cast<size_t>(b * part + t * g.kp + k)];
      gw[k * g.taps + t] = static_cast<float>(sum) + (accumulate ? gw[k * g.taps + t] : 0.f);
    }
    if (!cd.bias) continue;
    double sum = 0;
    for (int64_t b = 0; b < blocks; ++b)
      sum += parts[static_cast<size_t>(b * part + g.taps * g.kp + k)];
    db->data<float>()[k] = static_cast<float>(sum) + (accumulate ? db->data<float>()[k] : 0.f);
  }
}

}  // namespace dptrain::cpu
