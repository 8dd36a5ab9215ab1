// SPDX-License-Identifier: Apache-2.0
// CPU backend: a bf16 convolution's weight gradient on AMX tiles (CpuBackend::TilesWeightGradient)
// instead of oneDNN 2.6's jit kernel, which ran at a quarter to a half of the forward's rate on the
// same shapes. dW[r][s] = dy^T x shifted by the tap (r, s): one tile multiply per 32 pixels, tap
// and 16 x 16 block of (K, C), on a padded grid where every tap is one shift of x. Without AMX,
// the same sums on AVX512-BF16 dot products for the shapes where those beat oneDNN's
// avx512_core_bf16 kernel, two images at a time (PairGroup).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_backend_impl.h"
#include "core/elementwise.h"
#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define DPT_HAS_TILES 1
// GCC 12 warns that its own intrinsics' undefined operands are (or may be) used uninitialized
// (gcc.gnu.org/PR105593); they are not.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#else
#define DPT_HAS_TILES 0
#endif

namespace dptrain::cpu {

// ---- the layout ----------------------------------------------------------------------------
// Each image lies on a grid of rows wg = W + 2 pad positions wide. x's pixel (i, j) is at grid
// position u = (i + pad) wg + j + pad, every other position is zero; dy's pixel (p, q) is at
// t = p wg + q, zero where q >= OW (the last S - 1 positions of a grid row) and past OH rows, up
// to `t` positions (a multiple of 32). The output pixel at t reads x at u = t + o for the tap
// (r, s), o = r wg + s, and dy is zero wherever t + o would wrap into the next row or image, so
// dW[r][s] = sum over t of dy[t] x[t + o], one sum over the grid per tap.
//
// The tile multiply (TDPBF16PS) sums C[m][n] += A[m][2i] B[i][2n] + A[m][2i + 1] B[i][2n + 1]
// over 16 i: A is dy transposed (dyT: K rows of the t positions, 32 at a time), B is x in pairs
// of grid positions (xv: pair i holds each channel of u and u + 1 side by side), C is a 16 x 16
// block of dW[r][s] as (K, C). A tap's shift o moves B by o / 2 rows, which keeps its rows on
// 64-byte lines (an unaligned tile load ran at a third of the speed); an odd o reads the copy of
// xv paired from position 1 (`par` 1). dyT's rows start on 64-byte lines too (t % 32 == 0).
//
// Stride 2 splits x into four phase grids, its even or odd padded rows by its even or odd padded
// columns, each wg = (W + 2 pad) / 2 wide (rounded up), dy's grid as wide: the tap (r, s) reads
// phase (r % 2, s % 2) at the shift o = (r / 2) wg + s / 2. A planar x (C, H, W) of under 16
// channels (a first layer's) has its pairs built from each channel's grid (PrepPlanar), and the
// tiles of x and of the sums are C columns wide.

namespace {

constexpr int64_t kChunk = 32;        // grid positions per tile multiply
constexpr int64_t kPixelBlock = 256;  // positions a group of accumulators runs over at a time
constexpr int64_t kBlocks = 8;        // images are summed in this many fixed blocks (at most)
// Where the weight is split: images prepared at a time, up to 16 and as many as kGroupBytes hold
// (each group of accumulators reads them all: from the second cache level, 2 MiB a core here;
// ResNet-18's 256-channel 3x3 at 14 x 14, batch 32, took 6.4 ms with 16 images, 4.3 MB, and 4.3
// ms with 2).
constexpr int64_t kGroupImages = 16;
constexpr int64_t kGroupBytes = 1 << 20;
constexpr int64_t kAlign = 64;  // bytes: a tile row
constexpr int kDotRows = 8;     // rows of K a group of dot-product sums holds (3 taps: 24 zmm)
// Whether the products run on AVX512-BF16 dot products (PairGroup) instead of AMX tiles.
bool UsesDots();

struct Grid {
  int64_t st, wg, rows, t, pairs, taps, max_shift;
  explicit Grid(const Conv2dDesc& d)
      : st(d.stride),
        wg((d.w + 2 * d.pad + d.stride - 1) / d.stride),
        rows((d.h + 2 * d.pad + d.stride - 1) / d.stride),
        t((d.out_h() * wg + kChunk - 1) / kChunk * kChunk),
        taps(d.r * d.s),
        max_shift((d.r - 1) / d.stride * wg + (d.s - 1) / d.stride) {
    pairs = (t + max_shift) / 2 + 1;  // B rows a chunk reads: up to (t + max_shift) / 2 - 1
  }
  // Whether every tap's shift stays within the grid row and rows of the pixel it serves.
  bool Fits(const Conv2dDesc& d) const {
    return wg >= d.out_w() + (d.s - 1) / st && rows >= d.out_h() + (d.r - 1) / st;
  }
  // Elements of one phase's xv (both pairings) for c channels.
  int64_t phase_elems(int64_t c) const { return 2 * pairs * c * 2; }
};

int64_t AlignUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Images prepared and multiplied together: enough 32-position chunks (16) for each group of
// accumulators to amortise loading and storing them, at most 8 images.
int64_t ImagesAtOnce(const Grid& g) {
  const int64_t chunks = g.t / kChunk;
  return std::clamp<int64_t>((16 + chunks - 1) / chunks, 1, 8);
}

// One thread's prep buffers for ImagesAtOnce images, bf16: xv (the two pairings of x's grid) and
// dyT, each image's after the last's; and for a planar x, its channels' grids (PrepPlanar).
struct ThreadBuffers {
  int64_t images, xv, dyt, plane;  // bytes of one image's xv, dyT; of the planes
  int64_t Total() const { return images * (xv + dyt) + plane; }
};
ThreadBuffers BuffersOf(const Conv2dDesc& d, const Grid& g) {
  return {ImagesAtOnce(g), AlignUp(g.st * g.st * g.phase_elems(d.c) * 2), AlignUp(d.k * g.t * 2),
          d.x_nhwc ? 0 : AlignUp(d.c * (2 * g.pairs + 2) * 2)};
}
int64_t BlocksOf(const Conv2dDesc& d) { return std::min<int64_t>(kBlocks, d.n); }
int64_t PartialBytes(const Conv2dDesc& d, const Grid& g) {
  return AlignUp(g.taps * d.k * d.c * 4) + AlignUp(d.k * 8);  // dW's and db's sums of a block
}

// The work is split over threads one of two ways. By images (the default): each of at most
// kBlocks fixed blocks of images sums into its own copy of dW, added in block order at the end.
// By weight (SplitsWeight: C x K above 128 x 128, where those copies of dW cost more than they
// save): a few images at a time are prepared by all threads, then each thread multiplies
// whole groups of accumulators over them into dW's one sum, the images in order.
bool SplitsWeight(const Conv2dDesc& d) { return d.c * d.k > 128 * 128; }

// Splitting the weight: dW's sums (taps, K, C) and db's (K doubles), then per prepared image
// db's row sums, xv and dyT.
struct WeightSplit {
  int64_t images, sums, bias, xv, dyt;  // images at a time; bytes: dW's sums; db's sums (and one
                                        // image's), one image's xv, dyT
  int64_t Total() const { return sums + bias + images * (bias + xv + dyt); }
};
WeightSplit WeightSplitOf(const Conv2dDesc& d, const Grid& g) {
  const ThreadBuffers tb = BuffersOf(d, g);
  const int64_t bias = AlignUp(d.k * 8);
  const int64_t images =
      std::clamp<int64_t>(kGroupBytes / (bias + tb.xv + tb.dyt), 1, kGroupImages);
  return {images, AlignUp(g.taps * d.k * d.c * 4), bias, tb.xv, tb.dyt};
}

// ---- image pairs: the dot products --------------------------------------------------------------
// Without AMX, the dot products pair two images at one position instead of two positions of one
// image (as the tiles do): images 2i and 2i + 1 interleaved channel by channel (xp: x on the padded
// grid, or its four phase grids at stride 2, each channel's 32 bits that channel of the two
// images; dy2: dy the same at each output pixel, unpadded). A tap's shift then moves whole
// positions, so x is prepared once (not in two pairings) and dy is not transposed: the broadcast
// pair of a row of K is its two images' values at one pixel, and its kDotRows rows lie side by
// side; and only the output pixels are multiplied, not the grid's padded columns. An odd last
// image is paired with zeros. Every shape TilesWeightGradient takes on dot products (a
// channels-last x, C and K multiples of 16, the weight not split) runs so.
bool PairsImages() { return TilesByDots(); }
// One thread's prepared pairs: as many as half of kGroupBytes holds, up to 8 (each group of
// accumulators reads them all, from the second cache level).
struct PairBuffers {
  int64_t pairs, xp, dy2;  // image pairs prepared at a time; bytes of one pair's xp, dy2
  int64_t Total() const { return pairs * (xp + dy2); }
};
PairBuffers PairBuffersOf(const Conv2dDesc& d, const Grid& g) {
  const int64_t xp = AlignUp(g.st * g.st * g.rows * g.wg * d.c * 4),
                dy2 = AlignUp(d.out_h() * d.out_w() * d.k * 4);
  return {std::clamp<int64_t>(kGroupBytes / 2 / (xp + dy2), 1, 8), xp, dy2};
}
int64_t PairBlocksOf(const Conv2dDesc& d) { return std::min<int64_t>(kBlocks, (d.n + 1) / 2); }

}  // namespace

size_t TileScratchBytes(const Conv2dDesc& d, int threads) {
  const Grid g(d);
  if (PairsImages()) {
    return static_cast<size_t>(kAlign + PairBlocksOf(d) * PartialBytes(d, g) +
                               std::max(threads, 1) * PairBuffersOf(d, g).Total());
  }
  if (SplitsWeight(d)) return static_cast<size_t>(kAlign + WeightSplitOf(d, g).Total());
  return static_cast<size_t>(kAlign + BlocksOf(d) * PartialBytes(d, g) +
                             std::max(threads, 1) * BuffersOf(d, g).Total());
}

#if DPT_HAS_TILES
namespace {

// (AVX512-BF16 too: every AMX CPU has it, and the dot products' kernel shares these functions.)
#define DPT_TILES_TARGET                                                         \
  __attribute__((                                                                \
      target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi2," \
             "avx512bf16")))
#define DPT_DOTS_TARGET DPT_TILES_TARGET

// Interleaves the 16 bf16 of a 256-bit half with the other's: lo0 hi0 lo1 hi1 ...
alignas(64) constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                  21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                  11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// Bf16Bits of 16 floats (round to nearest even, NaN kept a quiet NaN): the rounding of the
// staging, so that an f32 x or dy gives the bits its bf16 values give.
DPT_TILES_TARGET inline __m256i Bf16x16(const float* p) {
  const __m512i u = _mm512_loadu_si512(p);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                         _mm512_and_si512(_mm512_srli_epi32(u, 16), one)),
                        16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// 16 channels at p, f32 or bf16, as bf16.
DPT_TILES_TARGET inline __m256i Load16(const char* p, bool bf16) {
  return bf16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
              : Bf16x16(reinterpret_cast<const float*>(p));
}

// The 16 rows of 64 bytes at src (16 32-bit lanes each) transposed into 16 rows of 64 bytes at
// dst, dst_stride elements apart: unrolled, so that the rows stay in registers.
DPT_TILES_TARGET inline void TransposeStore(const uint16_t* src, uint16_t* dst,
                                            int64_t dst_stride) {
  __m512i r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(src + i * 32);
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // the 128-bit lanes of rows i, 4 + i, 8 + i, 12 + i
    const __m512i ab_lo = _mm512_shuffle_i32x4(r[i], r[4 + i], 0x88),
                  ab_hi = _mm512_shuffle_i32x4(r[i], r[4 + i], 0xdd),
                  cd_lo = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0x88),
                  cd_hi = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0xdd);
    _mm512_store_si512(dst + i * dst_stride, _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88));
    _mm512_store_si512(dst + (8 + i) * dst_stride, _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xdd));
    _mm512_store_si512(dst + (4 + i) * dst_stride, _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88));
    _mm512_store_si512(dst + (12 + i) * dst_stride, _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xdd));
  }
}

// 16 bf16 channels of one position, then those of the next, interleaved (one row of pairs).
DPT_TILES_TARGET inline __m512i Pair(__m256i lo, __m256i hi, __m512i idx) {
  return _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

// Walks a grid position by position: at grid row gi, column gj, the pixel (st gi + row0,
// st gj + col0) of an image of rows x cols pixels of `pixel_bytes` each, or null where there is
// none.
class GridWalk {
 public:
  GridWalk(const char* image, int64_t wg, int64_t st, int64_t row0, int64_t col0, int64_t rows,
           int64_t cols, int64_t pixel_bytes)
      : image_(image),
        wg_(wg),
        st_(st),
        row0_(row0),
        col0_(col0),
        rows_(rows),
        cols_(cols),
        pixel_(pixel_bytes) {
    SetRow();
  }
  const char* Next() {
    const int64_t j = st_ * gj_ + col0_;
    const char* p = row_ != nullptr && j >= 0 && j < cols_ ? row_ + j * pixel_ : nullptr;
    if (++gj_ == wg_) {
      gj_ = 0;
      ++gi_;
      SetRow();
    }
    return p;
  }

 private:
  void SetRow() {
    const int64_t i = st_ * gi_ + row0_;
    row_ = i >= 0 && i < rows_ ? image_ + i * cols_ * pixel_ : nullptr;
  }
  const char* image_;
  int64_t wg_, st_, row0_, col0_, rows_, cols_, pixel_, gi_ = 0, gj_ = 0;
  const char* row_ = nullptr;
};

// One phase's xv: the padded rows a, a + st, ... by the padded columns b, b + st, ...
DPT_TILES_TARGET void PrepPhase(const Conv2dDesc& d, const Grid& g, const char* x, bool bf16,
                                int64_t a, int64_t b_col, uint16_t* xv) {
  const int64_t c = d.c, es = bf16 ? 2 : 4;
  const __m512i idx = _mm512_load_si512(kInterleave);
  uint16_t* x0 = xv;
  uint16_t* x1 = xv + g.pairs * c * 2;
  GridWalk walk(x, g.wg, g.st, a - d.pad, b_col - d.pad, d.h, d.w, c * es);
  for (int64_t i = 0; i <= g.pairs; ++i) {  // row `pairs` of pairing 0 only for pairing 1's last
    const char* pa = walk.Next();
    const char* pb = walk.Next();
    for (int64_t cb = 0; cb < c; cb += 16) {
      const __m512i v =
          Pair(pa != nullptr ? Load16(pa + cb * es, bf16) : _mm256_setzero_si256(),
               pb != nullptr ? Load16(pb + cb * es, bf16) : _mm256_setzero_si256(), idx);
      if (i < g.pairs) _mm512_store_si512(x0 + i * c * 2 + cb * 2, v);
      if (i > 0) {
        const __m512i prev = _mm512_load_si512(x0 + (i - 1) * c * 2 + cb * 2);
        _mm512_store_si512(x1 + (i - 1) * c * 2 + cb * 2, _mm512_shrdi_epi32(prev, v, 16));
      }
    }
  }
}

// A planar x (C, H, W) of under 16 channels (a first layer's image): each phase's grid per
// channel in bf16 (plane, zero on the padding), then row i of pairing p holds, channel by
// channel, the 32 bits at position 2i + p of that channel's grid: its values there and one on.
DPT_TILES_TARGET void PrepPlanar(const Conv2dDesc& d, const Grid& g, const char* x, bool bf16,
                                 uint16_t* plane, uint16_t* xv) {
  const int64_t c = d.c, positions = 2 * g.pairs + 2;
  for (int64_t ph = 0; ph < g.st * g.st; ++ph) {
    const int64_t a = ph / g.st, b = ph % g.st;
    for (int64_t ch = 0; ch < c; ++ch) {
      uint16_t* gp = plane + ch * positions;
      std::fill_n(gp, positions, uint16_t{0});
      // (positions past those the pairs read are left out)
      for (int64_t gi = 0; gi < g.rows && gi * g.wg < positions; ++gi) {
        const int64_t i = g.st * gi + a - d.pad;
        if (i < 0 || i >= d.h) continue;
        const int64_t row = (ch * d.h + i) * d.w;
        if (g.st == 1) {  // the row as it lies, at column pad
          uint16_t* o = gp + gi * g.wg + d.pad;
          const int64_t n = std::min(d.w, positions - (gi * g.wg + d.pad));
          int64_t j = 0;
          if (!bf16) {
            for (; j + 16 <= n; j += 16) {
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + j),
                                  Bf16x16(reinterpret_cast<const float*>(x) + row + j));
            }
          }
          for (; j < n; ++j) {
            o[j] = bf16 ? reinterpret_cast<const uint16_t*>(x)[row + j]
                        : Bf16Bits(reinterpret_cast<const float*>(x)[row + j]);
          }
          continue;
        }
        for (int64_t gj = 0; gj < g.wg && gi * g.wg + gj < positions; ++gj) {
          const int64_t j = g.st * gj + b - d.pad;
          if (j < 0 || j >= d.w) continue;
          gp[gi * g.wg + gj] = bf16 ? reinterpret_cast<const uint16_t*>(x)[row + j]
                                    : Bf16Bits(reinterpret_cast<const float*>(x)[row + j]);
        }
      }
    }
    uint16_t* out = xv + ph * g.phase_elems(c);
    for (int64_t par = 0; par < 2; ++par) {
      for (int64_t i = 0; i < g.pairs; ++i) {
        uint16_t* row = out + (par * g.pairs + i) * c * 2;
        for (int64_t ch = 0; ch < c; ++ch) {
          std::memcpy(row + ch * 2, plane + ch * positions + 2 * i + par, 4);
        }
      }
    }
  }
}

// xv of one image (x: its (H, W, C), f32 or bf16), phase by phase: pairing 0's row i is grid
// positions 2i and 2i + 1, pairing 1's is 2i + 1 and 2i + 2, the high half of one row of pairing
// 0 and the low half of the next (VPSHRDD).
DPT_TILES_TARGET void PrepX(const Conv2dDesc& d, const Grid& g, const char* x, bool bf16,
                            uint16_t* xv) {
  for (int64_t ph = 0; ph < g.st * g.st; ++ph) {
    PrepPhase(d, g, x, bf16, ph / g.st, ph % g.st, xv + ph * g.phase_elems(d.c));
  }
}

// dyT of one image (dy: its (OH, OW, K), f32 or bf16); and, for a bias, each row's sum added to
// db (in double, in order).
DPT_TILES_TARGET void PrepDy(const Conv2dDesc& d, const Grid& g, const char* dy, bool bf16,
                             uint16_t* dyt, double* db) {
  const int64_t k = d.k, es = bf16 ? 2 : 4;
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t kb = 0; kb < k; kb += 16) {
    GridWalk walk(dy + kb * es, g.wg, 1, 0, 0, d.out_h(), d.out_w(), k * es);
    for (int64_t t0 = 0; t0 < g.t; t0 += kChunk) {
      // 16 pairs of positions as rows of 16 (2-position) lanes, transposed: row kb + j is
      // channel kb + j's 32 positions in order
      alignas(64) uint16_t pairs[16 * 32];
      for (int64_t p = 0; p < 16; ++p) {
        const char* a = walk.Next();
        const char* b = walk.Next();
        _mm512_store_si512(pairs + p * 32,
                           Pair(a != nullptr ? Load16(a, bf16) : _mm256_setzero_si256(),
                                b != nullptr ? Load16(b, bf16) : _mm256_setzero_si256(), idx));
      }
      TransposeStore(pairs, dyt + kb * g.t + t0, g.t);
    }
  }
  if (db == nullptr) return;
  // Eight sums a row, each over every eighth position, then added pairwise: a fixed order
  // (the same bits on any thread count) without one chain of dependent additions (which took as
  // long as the products for ref_cnn's conv2).
  for (int64_t j = 0; j < k; ++j) {
    const uint16_t* row = dyt + j * g.t;
    double s[8] = {};
    for (int64_t t = 0; t < g.t; t += 8) {  // (g.t: a multiple of kChunk)
      for (int l = 0; l < 8; ++l) s[l] += ew::Bf16ToFloat(row[t + l]);
    }
    db[j] += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  }
}

// What a group of accumulators multiplies over: positions [lo, hi) of `images` images whose
// dyT and xv lie a_image and b_image elements apart; A's rows a_stride bytes apart, B's b_stride.
struct Span {
  int64_t images, a_image, b_image, lo, hi, a_stride, b_stride;
};

// The accumulators of one group over a Span: each C tile loaded from the block's sums, multiplied
// into, stored back (c_stride bytes between its rows). Tiles 0-3 accumulate, 4-5 hold dyT (A),
// 6-7 xv (B), alternating so that a load does not wait for the multiply before it.
//
// kTaps (1-3) taps of one 16 x 16 block of (K, C), sharing A.
template <int kTaps>
DPT_TILES_TARGET void TapGroup(const Span& sp, const uint16_t* a, const uint16_t* const b[3],
                               float* const c[3], int64_t c_stride) {
  _tile_loadd(0, c[0], c_stride);
  if constexpr (kTaps > 1) _tile_loadd(1, c[1], c_stride);
  if constexpr (kTaps > 2) _tile_loadd(2, c[2], c_stride);
  for (int64_t im = 0; im < sp.images; ++im) {
    const uint16_t* ai = a + im * sp.a_image;
    const char* b0 = reinterpret_cast<const char*>(b[0] + im * sp.b_image);
    const char* b1 = reinterpret_cast<const char*>(b[1] + im * sp.b_image);
    const char* b2 = reinterpret_cast<const char*>(b[2] + im * sp.b_image);
    for (int64_t t0 = sp.lo; t0 < sp.hi; t0 += kChunk) {
      const int64_t bt = t0 / 2 * sp.b_stride;  // B's rows are pairs of positions
      _tile_loadd(4, ai + t0, sp.a_stride);
      _tile_loadd(6, b0 + bt, sp.b_stride);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (kTaps > 1) {
        _tile_loadd(7, b1 + bt, sp.b_stride);
        _tile_dpbf16ps(1, 4, 7);
      }
      if constexpr (kTaps > 2) {
        _tile_loadd(6, b2 + bt, sp.b_stride);
        _tile_dpbf16ps(2, 4, 6);
      }
    }
  }
  _tile_stored(0, c[0], c_stride);
  if constexpr (kTaps > 1) _tile_stored(1, c[1], c_stride);
  if constexpr (kTaps > 2) _tile_stored(2, c[2], c_stride);
}

// One tap's 2 x 2 blocks of (K, C) (32 x 32): two A and two B tiles for four multiplies.
DPT_TILES_TARGET void SquareGroup(const Span& sp, const uint16_t* a, const uint16_t* b, float* c,
                                  int64_t c_stride) {
  float* c1 = c + 16;
  float* c2 = c + 16 * (c_stride / 4);
  float* c3 = c2 + 16;
  _tile_loadd(0, c, c_stride);
  _tile_loadd(1, c1, c_stride);
  _tile_loadd(2, c2, c_stride);
  _tile_loadd(3, c3, c_stride);
  const int64_t a1 = 16 * sp.a_stride / 2;  // dyT's next 16 rows, in elements
  for (int64_t im = 0; im < sp.images; ++im) {
    const uint16_t* ai = a + im * sp.a_image;
    const char* bi = reinterpret_cast<const char*>(b + im * sp.b_image);
    for (int64_t t0 = sp.lo; t0 < sp.hi; t0 += kChunk) {
      const char* bt = bi + t0 / 2 * sp.b_stride;
      _tile_loadd(4, ai + t0, sp.a_stride);
      _tile_loadd(6, bt, sp.b_stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, bt + 64, sp.b_stride);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, ai + a1 + t0, sp.a_stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, c_stride);
  _tile_stored(1, c1, c_stride);
  _tile_stored(2, c2, c_stride);
  _tile_stored(3, c3, c_stride);
}

// The groups of accumulators, in a fixed order: with C and K multiples of 32 one tap's 2 x 2
// blocks of (K, C) each (tap, then kb, then cb), else up to 3 taps of one 16 x 16 block each (kb,
// then cb, then the taps).
struct Groups {
  bool square;
  int64_t count;
};
Groups GroupsOf(const Conv2dDesc& d, const Grid& g) {
  if (d.k % 32 == 0 && d.c % 32 == 0) return {true, g.taps * (d.k / 32) * (d.c / 32)};
  return {false, (d.k / 16) * ((d.c + 15) / 16) * ((g.taps + 2) / 3)};
}

// Group i's products over a Span of prepared images (dyT and xv) added into dW's sums `part`
// ((taps, K, C) f32).
DPT_TILES_TARGET void RunGroup(const Conv2dDesc& d, const Grid& g, const Groups& gr, int64_t i,
                               const Span& sp, const uint16_t* dyt, const uint16_t* xv,
                               float* part) {
  const int64_t k = d.k, c = d.c, c_stride = c * 4;
  // B's first row for a tap: its phase's, in the pairing of its shift's parity, o / 2 rows on
  const auto b_of = [&](int64_t tap, int64_t cb) {
    const int64_t r = tap / d.s, s = tap % d.s, o = r / g.st * g.wg + s / g.st;
    return xv + (r % g.st * g.st + s % g.st) * g.phase_elems(c) + (o & 1) * g.pairs * c * 2 +
           (o >> 1) * c * 2 + cb * 2;
  };
  if (gr.square) {
    const int64_t blocks = (k / 32) * (c / 32), tap = i / blocks;
    const int64_t kb = i % blocks / (c / 32) * 32, cb = i % blocks % (c / 32) * 32;
    SquareGroup(sp, dyt + kb * g.t, b_of(tap, cb), part + (tap * k + kb) * c + cb, c_stride);
    return;
  }
  // up to 3 taps of one 16 x 16 block
  const int64_t per_block = (g.taps + 2) / 3, block = i / per_block, tap = i % per_block * 3;
  const int64_t c_blocks = (c + 15) / 16, kb = block / c_blocks * 16, cb = block % c_blocks * 16;
  const int64_t n = std::min<int64_t>(3, g.taps - tap);
  const uint16_t* b[3];
  float* acc[3];
  for (int64_t j = 0; j < 3; ++j) {
    const int64_t t = tap + std::min(j, n - 1);
    b[j] = b_of(t, cb);
    acc[j] = part + (t * k + kb) * c + cb;
  }
  const uint16_t* a = dyt + kb * g.t;
  if (n == 3) {
    TapGroup<3>(sp, a, b, acc, c_stride);
  } else if (n == 2) {
    TapGroup<2>(sp, a, b, acc, c_stride);
  } else {
    TapGroup<1>(sp, a, b, acc, c_stride);
  }
}

// The products of `images` prepared images (dyT and xv, one image's after the last's, as
// ThreadBuffers lays them) added into a block's sums `part`, every group. One image at a time
// spans positions in blocks of kPixelBlock (kept in the first cache level); several (small
// images) span each whole.
DPT_TILES_TARGET void Multiply(const Conv2dDesc& d, const Grid& g, const ThreadBuffers& tb,
                               int64_t images, const uint16_t* dyt, const uint16_t* xv,
                               float* part) {
  const Groups gr = GroupsOf(d, g);
  const int64_t block = images == 1 ? kPixelBlock : g.t;
  for (int64_t lo = 0; lo < g.t; lo += block) {
    const Span sp{images, tb.dyt / 2, tb.xv / 2, lo, std::min(g.t, lo + block), g.t * 2, d.c * 4};
    for (int64_t i = 0; i < gr.count; ++i) RunGroup(d, g, gr, i, sp, dyt, xv, part);
  }
}

// Every tile 16 rows (palette 1): A (dyT: tiles 4-5) 64 bytes wide, the accumulators (0-3) and B
// (xv: 6-7) 16 channels, or C's where C is under 16 (a planar x). GCC 12's _tile_loadconfig does
// not tell the compiler it reads the configuration, which then dropped the stores that fill it:
// the barrier keeps them.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
__attribute__((target("amx-tile"))) void LoadTileConfig(int64_t c) {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = static_cast<uint16_t>(i == 4 || i == 5 ? 64 : 4 * std::min<int64_t>(c, 16));
    cfg.rows[i] = 16;
  }
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}
__attribute__((target("amx-tile"))) void ReleaseTiles() { _tile_release(); }

// AMX: oneDNN's answer (DNNL_MAX_CPU_ISA caps it), then Linux's permission for the tile state,
// which a process asks for once (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
bool AmxAvailable() {
  static const bool ok = [] {
    if (dnnl::get_effective_cpu_isa() != dnnl::cpu_isa::avx512_core_amx) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return ok;
}

// Without AMX, AVX512-BF16's dot products (oneDNN's answer again, then the VBMI2 the
// preparation's pairings use: AMD Zen 4 and 5, Intel from Sapphire Rapids; not Cooper Lake).
bool UsesDots() {
  static const bool ok = [] {
    if (AmxAvailable()) return false;
    const auto isa = dnnl::get_effective_cpu_isa();
    return (isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx) &&
           __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi2");
  }();
  return ok;
}

}  // namespace

bool TilesAvailable() { return AmxAvailable() || UsesDots(); }
bool TilesByDots() { return UsesDots(); }

namespace {

// Bytes of one image of x and of dy.
int64_t XImage(const Conv2dDesc& d) { return d.h * d.w * d.c * (d.x_bf16 ? 2 : 4); }
int64_t DyImage(const Conv2dDesc& d) { return d.out_h() * d.out_w() * d.k * (d.dy_bf16 ? 2 : 4); }

// dw (K, C, R, S) and db, = or += the sums of `blocks` blocks part_bytes apart at base (each
// (taps, K, C) f32, then db's K doubles at PartialBytes' offset), added in block order in double:
// the same bits on any thread count. Inside a parallel region (an `omp for`).
void WriteOut(const Conv2dDesc& d, const Grid& g, const char* base, int64_t blocks,
              int64_t part_bytes, float* dw, float* db, bool accumulate) {
  const int64_t bias_at = AlignUp(g.taps * d.k * d.c * 4);
#pragma omp for schedule(static)
  for (int64_t o = 0; o < d.k; ++o) {
    for (int64_t i = 0; i < d.c; ++i) {
      for (int64_t tap = 0; tap < g.taps; ++tap) {
        double s = 0;
        for (int64_t b = 0; b < blocks; ++b) {
          s += reinterpret_cast<const float*>(base + b * part_bytes)[(tap * d.k + o) * d.c + i];
        }
        float& out = dw[(o * d.c + i) * g.taps + tap];
        out = (accumulate ? out : 0.f) + static_cast<float>(s);
      }
    }
    if (db != nullptr) {
      double s = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        s += reinterpret_cast<const double*>(base + b * part_bytes + bias_at)[o];
      }
      db[o] = (accumulate ? db[o] : 0.f) + static_cast<float>(s);
    }
  }
}

// Block b's sums in base (dW's (taps, K, C) floats, then db's K doubles; see PartialBytes), zeroed.
struct BlockSums {
  float* dw;
  double* db;
};
BlockSums ZeroedSums(const Conv2dDesc& d, const Grid& g, char* base, int64_t b,
                     int64_t part_bytes) {
  const int64_t dw_floats = g.taps * d.k * d.c;
  char* at = base + b * part_bytes;
  const BlockSums s{reinterpret_cast<float*>(at),
                    reinterpret_cast<double*>(at + AlignUp(dw_floats * 4))};
  std::fill_n(s.dw, dw_floats, 0.f);
  std::fill_n(s.db, d.k, 0.0);
  return s;
}

// dW's (and db's) sums split by images (see SplitsWeight), into dw and db.
void ByImages(const Conv2dDesc& d, const Grid& g, const char* x, const char* dy, char* base,
              int threads, float* dw, float* db, bool accumulate) {
  const ThreadBuffers tb = BuffersOf(d, g);
  const int64_t blocks = BlocksOf(d), part_bytes = PartialBytes(d, g);
  char* buffers = base + blocks * part_bytes;
  const int64_t x_image = XImage(d), dy_image = DyImage(d);
#pragma omp parallel num_threads(threads)
  {
    LoadTileConfig(d.c);
    char* mine = buffers + omp_get_thread_num() * tb.Total();
    auto* xv = reinterpret_cast<uint16_t*>(mine);
    auto* dyt = reinterpret_cast<uint16_t*>(mine + tb.images * tb.xv);
    auto* plane = reinterpret_cast<uint16_t*>(mine + tb.images * (tb.xv + tb.dyt));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const BlockSums sums = ZeroedSums(d, g, base, b, part_bytes);
      const int64_t n1 = (b + 1) * d.n / blocks;
      for (int64_t n0 = b * d.n / blocks; n0 < n1; n0 += tb.images) {
        const int64_t m = std::min(tb.images, n1 - n0);
        for (int64_t i = 0; i < m; ++i) {
          if (d.x_nhwc) {
            PrepX(d, g, x + (n0 + i) * x_image, d.x_bf16, xv + i * tb.xv / 2);
          } else {
            PrepPlanar(d, g, x + (n0 + i) * x_image, d.x_bf16, plane, xv + i * tb.xv / 2);
          }
          PrepDy(d, g, dy + (n0 + i) * dy_image, d.dy_bf16, dyt + i * tb.dyt / 2,
                 db != nullptr ? sums.db : nullptr);
        }
        Multiply(d, g, tb, m, dyt, xv, sums.dw);
      }
    }
    ReleaseTiles();
    WriteOut(d, g, base, blocks, part_bytes, dw, db, accumulate);
  }
}

// dW's (and db's) sums split by weight (see SplitsWeight), into dw and db.
void ByWeight(const Conv2dDesc& d, const Grid& g, const char* x, const char* dy, char* base,
              int threads, float* dw, float* db, bool accumulate) {
  DPT_CHECK(d.x_nhwc) << "conv2d tile weight split with a planar x: " << d.ToString();
  const WeightSplit ws = WeightSplitOf(d, g);
  const Groups gr = GroupsOf(d, g);
  auto* sums = reinterpret_cast<float*>(base);
  auto* bias_sum = reinterpret_cast<double*>(base + ws.sums);
  char* images = base + ws.sums + ws.bias;
  const auto bias_of = [&](int64_t i) { return reinterpret_cast<double*>(images + i * ws.bias); };
  uint16_t* xv = reinterpret_cast<uint16_t*>(images + ws.images * ws.bias);
  uint16_t* dyt = reinterpret_cast<uint16_t*>(images + ws.images * (ws.bias + ws.xv));
  const int64_t x_image = XImage(d), dy_image = DyImage(d);
  std::fill_n(sums, g.taps * d.k * d.c, 0.f);
  std::fill_n(bias_sum, d.k, 0.0);
#pragma omp parallel num_threads(threads)
  {
    LoadTileConfig(d.c);
    for (int64_t n0 = 0; n0 < d.n; n0 += ws.images) {
      const int64_t m = std::min(ws.images, d.n - n0);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < m; ++i) {
        PrepX(d, g, x + (n0 + i) * x_image, d.x_bf16, xv + i * ws.xv / 2);
        double* bias = db != nullptr ? bias_of(i) : nullptr;
        if (bias != nullptr) std::fill_n(bias, d.k, 0.0);
        PrepDy(d, g, dy + (n0 + i) * dy_image, d.dy_bf16, dyt + i * ws.dyt / 2, bias);
      }
      // (the barrier above: every image prepared)
      const Span sp{m, ws.dyt / 2, ws.xv / 2, 0, g.t, g.t * 2, d.c * 4};
#pragma omp for schedule(static) nowait
      for (int64_t i = 0; i < gr.count; ++i) RunGroup(d, g, gr, i, sp, dyt, xv, sums);
#pragma omp single
      if (db != nullptr) {  // the images' bias sums in order
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t o = 0; o < d.k; ++o) bias_sum[o] += bias_of(i)[o];
        }
      }
      // (the barrier after `single`: the groups are done before the next images are prepared)
    }
    ReleaseTiles();
    WriteOut(d, g, base, 1, ws.sums + ws.bias, dw, db, accumulate);  // the one sum, as a block
  }
}

// xp of the image pair at xa and xb (xb null: zeros), each (H, W, C), f32 or bf16: the padded
// grid, position (gi, gj) holding pixel (gi - pad, gj - pad) of both, zero on the padding; at
// stride 2 its four phase grids one after the other, phase (a, b) holding padded pixel
// (2 gi + a, 2 gj + b) at (gi, gj).
DPT_DOTS_TARGET void PrepPairX(const Conv2dDesc& d, const Grid& g, const char* xa, const char* xb,
                               bool bf16, uint16_t* xp) {
  const int64_t c = d.c, es = bf16 ? 2 : 4;
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t ph = 0; ph < g.st * g.st; ++ph) {
    const int64_t pa = ph / g.st, pb = ph % g.st;
    for (int64_t gi = 0; gi < g.rows; ++gi) {
      const int64_t i = g.st * gi + pa - d.pad;
      for (int64_t gj = 0; gj < g.wg; ++gj) {
        const int64_t j = g.st * gj + pb - d.pad;
        uint16_t* out = xp + ((ph * g.rows + gi) * g.wg + gj) * c * 2;
        if (i < 0 || i >= d.h || j < 0 || j >= d.w) {
          for (int64_t cb = 0; cb < c; cb += 16) {
            _mm512_storeu_si512(out + cb * 2, _mm512_setzero_si512());
          }
          continue;
        }
        const int64_t at = (i * d.w + j) * c * es;
        for (int64_t cb = 0; cb < c; cb += 16) {
          const __m256i b =
              xb != nullptr ? Load16(xb + at + cb * es, bf16) : _mm256_setzero_si256();
          _mm512_storeu_si512(out + cb * 2, Pair(Load16(xa + at + cb * es, bf16), b, idx));
        }
      }
    }
  }
}

// 16 bf16 added to 16 double sums at s.
DPT_DOTS_TARGET inline void AddBf16(__m256i v, double* s) {
  const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  const __m256 lo = _mm512_castps512_ps256(f);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1));
  _mm512_storeu_pd(s, _mm512_add_pd(_mm512_loadu_pd(s), _mm512_cvtps_pd(lo)));
  _mm512_storeu_pd(s + 8, _mm512_add_pd(_mm512_loadu_pd(s + 8), _mm512_cvtps_pd(hi)));
}

// dy2 of the image pair at dya and dyb (dyb null: zeros), each (OH, OW, K), f32 or bf16; and, for
// a bias, each channel's sum over both images added to db (in double, pixel by pixel, the first
// image's value then the second's).
DPT_DOTS_TARGET void PrepPairDy(const Conv2dDesc& d, const char* dya, const char* dyb, bool bf16,
                                uint16_t* dy2, double* db) {
  const int64_t k = d.k, es = bf16 ? 2 : 4, pixels = d.out_h() * d.out_w();
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t t = 0; t < pixels; ++t) {
    for (int64_t kb = 0; kb < k; kb += 16) {
      const int64_t at = (t * k + kb) * es;
      const __m256i a = Load16(dya + at, bf16);
      const __m256i b = dyb != nullptr ? Load16(dyb + at, bf16) : _mm256_setzero_si256();
      _mm512_storeu_si512(dy2 + (t * k + kb) * 2, Pair(a, b, idx));
      if (db != nullptr) {
        AddBf16(a, db + kb);
        AddBf16(b, db + kb);
      }
    }
  }
}

// What a group of accumulators multiplies over: `pairs` prepared pairs, their dy2 and xp a_pair
// and b_pair elements apart.
struct PairSpan {
  int64_t pairs, a_pair, b_pair;
};

// kTaps (1-3) taps of kDotRows rows of K by 16 channels over a PairSpan, sharing A: per output
// pixel, each tap's xp position one vector (16 channels' pairs) and each K row's pair of dy2 one
// broadcast (the kDotRows pairs side by side); the kTaps x kDotRows sums stay in registers.
template <int kTaps>
DPT_DOTS_TARGET void PairGroup(const Conv2dDesc& d, const Grid& g, const PairSpan& sp,
                               const uint16_t* a, const uint16_t* const b[3], float* const c[3]) {
  const int64_t k2 = d.k * 2, c2 = d.c * 2, ow = d.out_w(), oh = d.out_h(), c_row = d.c;
  __m512 acc[kTaps][kDotRows];
#pragma GCC unroll 3
  for (int tp = 0; tp < kTaps; ++tp) {
#pragma GCC unroll 8
    for (int m = 0; m < kDotRows; ++m) acc[tp][m] = _mm512_loadu_ps(c[tp] + m * c_row);
  }
  for (int64_t pr = 0; pr < sp.pairs; ++pr) {
    for (int64_t p = 0; p < oh; ++p) {
      const uint16_t* ar = a + pr * sp.a_pair + p * ow * k2;
      const uint16_t* br[3];
#pragma GCC unroll 3
      for (int tp = 0; tp < kTaps; ++tp) br[tp] = b[tp] + pr * sp.b_pair + p * g.wg * c2;
      for (int64_t q = 0; q < ow; ++q) {
        __m512bh bv[kTaps];
#pragma GCC unroll 3
        for (int tp = 0; tp < kTaps; ++tp) {
          bv[tp] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(br[tp] + q * c2));
        }
#pragma GCC unroll 8
        for (int m = 0; m < kDotRows; ++m) {
          int32_t pair;
          std::memcpy(&pair, ar + q * k2 + m * 2, sizeof(pair));
          const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
#pragma GCC unroll 3
          for (int tp = 0; tp < kTaps; ++tp) acc[tp][m] = _mm512_dpbf16_ps(acc[tp][m], av, bv[tp]);
        }
      }
    }
  }
#pragma GCC unroll 3
  for (int tp = 0; tp < kTaps; ++tp) {
#pragma GCC unroll 8
    for (int m = 0; m < kDotRows; ++m) _mm512_storeu_ps(c[tp] + m * c_row, acc[tp][m]);
  }
}

// Every group's products over a PairSpan of prepared pairs added into a block's sums `part`
// ((taps, K, C) f32): kb, then cb, then up to 3 taps at a time.
DPT_DOTS_TARGET void MultiplyPairs(const Conv2dDesc& d, const Grid& g, const PairSpan& sp,
                                   const uint16_t* dy2, const uint16_t* xp, float* part) {
  const int64_t k = d.k, c = d.c, per_block = (g.taps + 2) / 3, c_blocks = c / 16;
  const int64_t count = (k / kDotRows) * c_blocks * per_block;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t block = i / per_block, tap = i % per_block * 3;
    const int64_t kb = block / c_blocks * kDotRows, cb = block % c_blocks * 16;
    const int64_t n = std::min<int64_t>(3, g.taps - tap);
    const uint16_t* b[3];
    float* acc[3];
    for (int64_t j = 0; j < 3; ++j) {
      const int64_t t = tap + std::min(j, n - 1), r = t / d.s, s = t % d.s;
      const int64_t phase = r % g.st * g.st + s % g.st, o = r / g.st * g.wg + s / g.st;
      b[j] = xp + ((phase * g.rows * g.wg) + o) * c * 2 + cb * 2;
      acc[j] = part + (t * k + kb) * c + cb;
    }
    const uint16_t* a = dy2 + kb * 2;
    if (n == 3) {
      PairGroup<3>(d, g, sp, a, b, acc);
    } else if (n == 2) {
      PairGroup<2>(d, g, sp, a, b, acc);
    } else {
      PairGroup<1>(d, g, sp, a, b, acc);
    }
  }
}

// dW's (and db's) sums by image pairs (PairsImages), into dw and db: at most kBlocks fixed blocks
// of pairs, each into its own sums, added in block order at the end.
void ByImagePairs(const Conv2dDesc& d, const Grid& g, const char* x, const char* dy, char* base,
                  int threads, float* dw, float* db, bool accumulate) {
  DPT_CHECK(d.x_nhwc && d.c % 16 == 0 && d.k % 16 == 0) << "conv2d image pairs: " << d.ToString();
  const PairBuffers pb = PairBuffersOf(d, g);
  const int64_t pairs = (d.n + 1) / 2, blocks = PairBlocksOf(d), part_bytes = PartialBytes(d, g);
  char* buffers = base + blocks * part_bytes;
  const int64_t x_image = XImage(d), dy_image = DyImage(d);
#pragma omp parallel num_threads(threads)
  {
    char* mine = buffers + omp_get_thread_num() * pb.Total();
    auto* xp = reinterpret_cast<uint16_t*>(mine);
    auto* dy2 = reinterpret_cast<uint16_t*>(mine + pb.pairs * pb.xp);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const BlockSums sums = ZeroedSums(d, g, base, b, part_bytes);
      const int64_t p1 = (b + 1) * pairs / blocks;
      for (int64_t p0 = b * pairs / blocks; p0 < p1; p0 += pb.pairs) {
        const int64_t m = std::min(pb.pairs, p1 - p0);
        for (int64_t i = 0; i < m; ++i) {
          const int64_t n0 = 2 * (p0 + i);
          const bool two = n0 + 1 < d.n;
          PrepPairX(d, g, x + n0 * x_image, two ? x + (n0 + 1) * x_image : nullptr, d.x_bf16,
                    xp + i * pb.xp / 2);
          PrepPairDy(d, dy + n0 * dy_image, two ? dy + (n0 + 1) * dy_image : nullptr, d.dy_bf16,
                     dy2 + i * pb.dy2 / 2, db != nullptr ? sums.db : nullptr);
        }
        MultiplyPairs(d, g, PairSpan{m, pb.dy2 / 2, pb.xp / 2}, dy2, xp, sums.dw);
      }
    }
    WriteOut(d, g, base, blocks, part_bytes, dw, db, accumulate);
  }
}

}  // namespace

void TileWeightGradient(const Conv2dDesc& d, const void* x, const void* dy, const Tensor& scratch,
                        int threads, float* dw, float* db, bool accumulate) {
  DPT_CHECK(TilesAvailable()) << "conv2d weight gradient on AMX tiles without AMX or AVX512-BF16";
  const Grid g(d);
  threads = std::max(threads, 1);
  DPT_CHECK(scratch.bytes() >= TileScratchBytes(d, threads))
      << "conv2d tile scratch of " << scratch.bytes() << " bytes for " << d.ToString();
  char* base = static_cast<char*>(scratch.raw());
  base += (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  const auto* xs = static_cast<const char*>(x);
  const auto* dys = static_cast<const char*>(dy);
  if (PairsImages()) {
    ByImagePairs(d, g, xs, dys, base, threads, dw, db, accumulate);
  } else if (SplitsWeight(d)) {
    ByWeight(d, g, xs, dys, base, threads, dw, db, accumulate);
  } else {
    ByImages(d, g, xs, dys, base, threads, dw, db, accumulate);
  }
}

#else  // no AMX tiles off x86-64

bool TilesAvailable() { return false; }
bool TilesByDots() { return false; }

void TileWeightGradient(const Conv2dDesc& d, const void*, const void*, const Tensor&, int, float*,
                        float*, bool) {
  DPT_THROW(InternalError) << "conv2d weight gradient on AMX tiles on this CPU: " << d.ToString();
}

#endif

bool CpuBackend::TilesWeightGradient(const Conv2dDesc& d) {
  // Images up to 16 x 16 output pixels, or 32 x 32 where C x K is 64 x 64 or more (the multiply
  // then outweighs the preparation: ResNet-18's first stage at 32 x 32) or x is planar with under
  // 16 channels (a first layer's: little to prepare) or the images are paired (below); a weight up
  // to 256 x 256.
  const int64_t pixels = d.out_h() * d.out_w(), ck = d.c * d.k;
  const bool planar = !d.x_nhwc && d.c < 16 && !SplitsWeight(d);  // (ByWeight: NHWC only)
  const bool pairs = TilesByDots() && d.stride == 1;
  const bool size_ok = pixels > 16 && (pixels <= 16 * 16 ||
                                       (pixels <= 32 * 32 && (ck >= 64 * 64 || planar || pairs)));
  // On dot products (no AMX), two images at a time (PairsImages), only a channels-last x with C a
  // multiple of 16, where they beat oneDNN 2.6's avx512_core_bf16 kernel (`train.profile`, batch
  // 64, 2 threads, in a step):
  // - strided: resnet8's layer2.0.conv1 0.47 -> 0.36 ms, layer3.0.conv1 0.54 -> 0.32,
  //   resnet18_cifar's layer2.0.conv1 4.7 -> 4.1, against the dot products on the tiles' pairs of
  //   positions, which had beaten oneDNN's kernel there (0.82 -> 0.50, 0.69 -> 0.57, 7.4 -> 6.7);
  // - stride 1, C x K up to 64 x 128: ref_cnn's conv2 0.80 -> 0.71 ms; resnet8's layer1 (16
  //   channels, 32 x 32) 0.70 -> 0.52-0.55, layer2.0.conv2 0.60 -> 0.45-0.51, layer3.0.conv2 0.62
  //   -> 0.56-0.58; resnet18_cifar's layer1 8.3-8.9 -> 6.7-7.2 ms; not its layer2 (128 x 128:
  //   7.2 -> 7.5-7.7).
  // Not a planar x, whose few channels would fill a fraction of each vector (on the tiles' pairs
  // of positions, resnet8's conv1 went 0.25 -> 0.62), nor a weight above 128 x 128, which each
  // group of 8 rows of K would read all the images' x again for (resnet18_cifar's layer3.0.conv1
  // went 4.9 -> 10.2 ms with the weight split).
  if (TilesByDots() && (!d.x_nhwc || SplitsWeight(d) || (pairs && ck > 64 * 128))) return false;
  return d.precision == Precision::kBF16 && d.groups == 1 && d.dilation == 1 &&
         (d.stride == 1 || d.stride == 2) && (planar || (d.x_nhwc && d.c % 16 == 0)) && d.y_nhwc &&
         d.k % 16 == 0 && ck <= 256 * 256 && size_ok && d.r <= 7 && d.s <= 7 &&
         !SubsamplesInput(d) && Grid(d).Fits(d) && PrecisionOk(d.precision) && TilesAvailable();
}

bool CpuBackend::TilesByDotProducts() { return TilesByDots(); }

bool CpuBackend::PlannedTiles(const OpPlan& plan) {
  const auto* p = dynamic_cast<const ConvPlan*>(&plan);
  return p != nullptr && p->tiles;
}

}  // namespace dptrain::cpu
