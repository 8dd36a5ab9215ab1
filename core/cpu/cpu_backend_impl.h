// SPDX-License-Identifier: Apache-2.0
// The CPU backend's internals, private to core/cpu/ (scripts/check-floors.sh): the oneDNN error
// macro, the staging of operands between the caller's layouts and a primitive's own, the plan
// types and their cache keys, and CpuBackend::Impl (engine, stream, plan caches, scratchpad). The
// backend's member functions live in one .cc per op family; this header is what they share.
#pragma once

#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/pool_window.h"

namespace dptrain::cpu {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

// oneDNN reports failures with dnnl::error; rethrow at the backend edge as DnnlError.
#define DPT_DNNL(expr)                                                    \
  [&]() {                                                                 \
    try {                                                                 \
      return expr;                                                        \
    } catch (const dnnl::error& e) {                                      \
      DPT_THROW(::dptrain::DnnlError)                                     \
          << #expr << ": " << e.what() << " (status " << e.status << ")"; \
    }                                                                     \
  }()

constexpr int64_t kParallelMin = 1 << 14;  // below this an OpenMP region costs more than it saves
// The largest window of channels-last max pooling on dptrain's own loops (PoolPlan::own): the
// workspace keeps each maximum's index in its window in a byte.
constexpr int64_t kOwnMaxPoolKernel = 16;

// A hot loop compiled three times (AVX-512, AVX2 + FMA, the x86-64 baseline) and picked for the
// machine when the program loads: the build stays portable and the loops still use the widest
// vectors there are. Elsewhere (not x86-64) the one baseline build. core/ compiles with
// -ffp-contract=off, so the wider builds round every product as the baseline does: no fused
// multiply-adds (they moved ResNet-50's one-step parity with PyTorch's float64 step past its
// bound, integration.onnx_import). The one exception is the fused first layer
// (cpu_conv_pool.cc), whose own kernels are bound by the multiply-adds. Sanitizer builds take the
// baseline only: the clones are picked by an ifunc resolver that runs before the sanitizer's
// runtime is up (a ThreadSanitizer build crashes at load).
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define DPT_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define DPT_SANITIZED 1
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(DPT_SANITIZED)
#define DPT_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DPT_SIMD_CLONES
#endif

// A helper that a DPT_SIMD_CLONES loop calls: always inlined, so that it is compiled into each
// clone. A template or lambda the compiler leaves out of line is built once, for the baseline:
// the batch norm's 16- and 32-channel row loops ran that way (SSE2) until this was added.
#define DPT_CLONE_INLINE inline __attribute__((always_inline))

// A 16 x 16 tile transposed in registers: rows r[0..15] of 16 floats (one AVX-512 register each in
// the clone built for it). Each stage swaps the off-diagonal K x K blocks of every 2K x 2K block
// (lane l of row i takes lane l - K of row i + K, and back); after K = 8, 4, 2, 1 row i holds
// column i. Lane indices are constants (__builtin_shufflevector): a two-register permute each.
// The layout changes (cpu_elementwise.cc) and the max pool that writes NCHW (cpu_pool.cc).
constexpr int64_t kTile = 16;
using TileRow = float __attribute__((vector_size(kTile * sizeof(float))));
template <size_t K, size_t... L>
[[gnu::always_inline]] inline void SwapBlocks(TileRow* r, std::index_sequence<L...> /*lanes*/) {
  for (size_t i = 0; i < kTile; ++i) {
    if ((i & K) != 0) continue;
    const TileRow a = r[i], b = r[i + K];
    // cppcheck 2.10 reads the lane pack expansion as an unused array access (constStatement).
    // cppcheck-suppress constStatement
    r[i] = __builtin_shufflevector(a, b, ((L & K) != 0 ? L - K + kTile : L)...);
    // cppcheck-suppress constStatement
    r[i + K] = __builtin_shufflevector(a, b, ((L & K) != 0 ? L + kTile : L + K)...);
  }
}
[[gnu::always_inline]] inline void TransposeTile(TileRow* r) {
  constexpr auto lanes = std::make_index_sequence<kTile>();
  SwapBlocks<8>(r, lanes);
  SwapBlocks<4>(r, lanes);
  SwapBlocks<2>(r, lanes);
  SwapBlocks<1>(r, lanes);
}

// ew::FloatToBf16 (round to nearest even, NaN kept a quiet NaN) without its branch, so that the
// loops around it vectorise.
inline uint16_t Bf16Bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

// Bf16Bits of 16 floats at once, in GCC's vector extensions (one 512-bit vector in the AVX-512
// clone of the loop around it, two 256-bit ones in the AVX2 clone). A loop of Bf16Bits left to
// the vectoriser came out at half the width of the f32 loops beside it (GCC sized it by the
// 16-bit stores): the batch norm's bf16 dx ran slower than its f32 dx, at half the bytes.
using U16x16 = uint16_t __attribute__((vector_size(32)));
using U32x16 = uint32_t __attribute__((vector_size(64)));
DPT_CLONE_INLINE void Bf16Bits16(const float* v, uint16_t* out) {
  U32x16 u;
  std::memcpy(&u, v, sizeof(u));
  const U32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U32x16 quiet = (u >> 16) | 0x40u;
  const U16x16 bits =
      __builtin_convertvector((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded, U16x16);
  std::memcpy(out, &bits, sizeof(bits));
}

// Bf16Bits of a run of n floats: 16 at a time (Bf16Bits16), then the tail.
DPT_CLONE_INLINE void Bf16BitsRun(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) Bf16Bits16(in + i, out + i);
  for (; i < n; ++i) out[i] = Bf16Bits(in[i]);
}

// The argument checks of the ops.
inline void CheckF32(const Tensor& t, const char* what) {
  DPT_CHECK(t.defined() && t.dtype() == DType::kF32 && t.device() == Device::kCpu)
      << what << ": expected a cpu f32 tensor";
}
inline void CheckSame(const Tensor& a, const Tensor& b, const char* what) {
  DPT_CHECK(a.numel() == b.numel())
      << what << ": " << a.shape().ToString() << " vs " << b.shape().ToString();
}

// oneDNN primitive attributes with a user-managed scratchpad (execution allocates nothing).
dnnl::primitive_attr MakeAttr();

// A tensor in the caller's layout (f32, NCHW / OIHW / NC) seen by a primitive that wants its own
// layout (blocked formats such as nChw16c, and bf16 for bf16 precision): the primitive's memory
// is either the caller's tensor itself (same descriptor) or a staging buffer filled / drained by
// a reorder. Staging buffers belong to the plan; plans run one call at a time.
//
// fp16 precision (oneDNN has no fp16 kernels for this CPU) is computed as the CUDA backend's
// fp16 mode computes it: operands rounded to fp16, products accumulated in f32, results rounded
// to fp16 (a gradient beyond 65504 becomes infinity, which fp16 loss scaling detects). `half`
// marks such a tensor: inputs are rounded into `rounded` first, outputs are rounded in place.
struct Staged {
  memory::desc user, inner;
  bool same = true;
  bool half = false;
  // A staged input the backward reads again (Holds, Again) has one copy per layer sharing the
  // plan (AddCopy): two same-shaped convolutions (a ResNet stage's) each find their own input
  // staged in backward, instead of the later forward's. In() restages into the copy that holds
  // the tensor already, else into the least recently staged one. Outputs use copies[0].
  struct Copy {
    Tensor buf, rounded;
    mutable const void* src = nullptr;  // the tensor staged here last (null: none, or failed)
    mutable uint64_t used = 0;          // when (Staged::clock)
  };
  std::vector<Copy> copies;
  dnnl::reorder to_inner, to_user;

  // `share`: a Staged whose buffers this one may use too (the same inner layout and rounding,
  // and never needed at the same time), instead of its own.
  void Init(CpuBackend& be, const dnnl::engine& eng, const memory::desc& user_md,
            const memory::desc& inner_md, const std::string& label, bool round_half = false,
            bool is_input = false, const Staged* share = nullptr);
  // One more copy of an input's buffers (none when the primitive reads the caller's tensor); the
  // bytes it holds.
  size_t AddCopy(CpuBackend& be);
  // The primitive's input memory holding t's values (rounded to fp16 when `half`).
  memory In(const dnnl::engine& eng, dnnl::stream& st, const Tensor& t) const;
  // Whether a copy holds the tensor at t's address as the last In() of it staged it, and that
  // staged memory again (valid while t's values are those it had then: the caller's promise,
  // see Conv2dBackward).
  bool Holds(const Tensor& t) const { return Holding(t) != nullptr; }
  // Whether `other`'s primitive reads the same staged memory: one inner layout, one rounding.
  bool ReadsLike(const Staged& other) const { return inner == other.inner && half == other.half; }
  memory Again(const dnnl::engine& eng, const Tensor& t) const;
  // The primitive's output memory for t; call Out() after the primitive ran.
  memory OutMem(const dnnl::engine& eng, const Tensor& t) const;
  void Out(const dnnl::engine& eng, dnnl::stream& st, const Tensor& t) const;

 private:
  const Copy* Holding(const Tensor& t) const;
  std::string label_;
  bool is_input_ = false;
  bool plain_bf16_ = false;  // In() rounds f32 to bf16 in one dense order itself (PlainToBf16)
  mutable uint64_t clock_ = 0;
};

// The bytes a plan holds in staging buffers and other tensors (OpPlan::held_bytes).
size_t HeldBytes(std::initializer_list<const Staged*> staged,
                 std::initializer_list<const Tensor*> tensors);

inline Dt ComputeType(Precision p) { return p == Precision::kBF16 ? Dt::bf16 : Dt::f32; }

// Conv2d and linear run the same three primitives on the same staged operands: forward
// (x, w -> y), backward data (dy, w -> dx) and backward weights (x, dy -> dw and db).
struct WeightedPlan : OpPlan {
  bool bias = false;
  memory::desc b_md, fwd_scratch, data_scratch, weights_scratch;  // b_md: as the forward reads it
  // Linear runs its three passes as oneDNN matmuls (cpu_linear.cc): forward y = x W^T, backward
  // data dx = dy W, backward weights dW = dy^T x, with the bias gradient summed here. A matmul
  // reads W^T and dy^T as other dims over the same bytes: these views, applied when the passes
  // run.
  bool matmul = false;
  memory::desc fwd_w_view, w_dy_view;
  memory::desc fwd_y_view;  // y as the forward matmul writes it (conv2d's ConvPlan::gemm)
  // The weight gradient as that matmul, dW = dy^T x, with dW written through w_dw_view when set
  // (linear; conv2d's unfolded path, ConvPlan::unfold).
  bool weights_matmul = false;
  memory::desc w_dw_view;
  // Conv2d's input gradient as a forward convolution (CpuBackend::FlipsBackwardData): the data
  // pass is that primitive, reading w_flip (C, K, R, S: w transposed, each kernel rotated 180
  // degrees), which FlipKernel refills from w before each run.
  bool data_flip = false;
  Tensor w_flip;
  dnnl::primitive fwd, bwd_data, bwd_w;
  // forward: x, w in; y out. backward data: dy, w in; dx out. backward weights: x, dy in; dw out.
  Staged f_x, f_w, f_y, d_dy, d_w, d_dx, w_x, w_dy, w_dw;
  Tensor acc_w, acc_b;  // accumulate = true computes here first, then adds
  // Linear on two threads (CpuBackend::LinearBackward): the two backward matmuls again, each
  // planned for one thread, run side by side.
  dnnl::primitive serial_data, serial_w;
  memory::desc serial_data_scratch, serial_w_scratch;
};

// A convolution's input unfolded for its weight gradient as a GEMM (UnfoldsWeightGradient): one
// row per output pixel (n, oh, ow), its columns the kernel window's (r, s, c) in that order, in
// bf16, zero where the window lies on the padding. dW = dy^T cols is then (K, R, S, C): OHWI.
// With `gemm` (the CPU fusions on) the other two passes are GEMMs over the same columns too: the
// forward y = cols W^T, and the input gradient's columns dcols = dy W (f32), which Col2Im sums
// back into dx.
//
// A 1x1 convolution with stride s and no padding (CpuBackend::SubsamplesInput) runs as the
// stride-1 one over x's every s-th pixel of every s-th row (`subsample`): the staging of x
// (Staged, from a strided view of the caller's tensor) picks them out, and the input gradient is
// computed into dx_sub, then spread into dx with zeros between (Spread).
struct ConvPlan final : WeightedPlan {
  Conv2dDesc d;  // as the caller described it
  bool unfold = false;
  bool gemm = false;       // all three passes as GEMMs over the unfolded input (with `unfold`)
  bool winograd = false;   // planned with convolution_winograd (train.winograd)
  bool subsample = false;  // a strided 1x1 convolution run as a stride-1 one
  memory::desc cols_md;    // (N * OH * OW, R * S * C) bf16, row-major
  Tensor cols;             // `gemm` (else the weight gradient unfolds into Impl::transient)
  // `gemm`: the tensor the plan's last forward unfolded into cols (null once anything else did)
  mutable const void* cols_x = nullptr;
  // `gemm`: dcols (cols_md's dims, f32, in Impl::transient), and dy and the staged OHWI weight as
  // the data GEMM reads them: (N * OH * OW, K) and (K, R * S * C).
  memory::desc dcols_md, data_dy_view, data_w_view;
  // `subsample`: the input gradient at the pixels the convolution reads (NHWC, f32, in
  // Impl::transient)
  Shape dx_sub;
  // CpuBackend::PhasesBackwardData: dx's phase (pi, pj), its rows 2m + pi and columns 2q + pj,
  // is the stride-1 forward convolution of dy (N, K, OH, OW) with the taps of w that reach it,
  // transposed (C <-> K): for an even row the middle row of taps, for an odd one the last then
  // the first (dx[2m + 1] = dy[m] w[2] + dy[m + 1] w[0]), padded by one after the end; columns
  // the same. Four such (1x1, 1x2, 2x1, 2x2) write (N, C, OH, OW) each into Impl::transient, two
  // at a time (dx's even rows, then its odd ones), and Interleave puts those into dx. The same
  // products, summed in another order.
  struct Phase {
    dnnl::primitive prim;
    memory::desc w_user, w_md, out_md, scratch;  // w_user: the f32 (C, K, R', S') taps
    dnnl::reorder w_reorder;                     // w_user -> w_md (bf16, the kernel's layout)
    Tensor w;                                    // in w_md
  };
  std::vector<Phase> phases;  // none, or (0, 0), (0, 1), (1, 0), (1, 1)
  Tensor phase_taps;          // the f32 taps of one phase (C * K * 4)
  // CpuBackend::TilesWeightGradient: the weight gradient by TileWeightGradient, reading the
  // caller's x and dy, with up to tile_threads threads (its scratch in Impl::transient).
  bool tiles = false;
  // CpuBackend::BlocksWeightGradient: the weight gradient's x and dy staged into oneDNN's blocked
  // layout (Staged w_x, w_dy) from the channels-last activations the other passes read.
  bool blocked_weights = false;
  int tile_threads = 0;
};
// dx's rows of parity pi (N, H, W, C, f32) from phases (pi, 0) and (pi, 1) (ConvPlan::phases),
// one after the other in `parts`.
void Interleave(const ConvPlan& p, const Tensor& parts, int64_t pi, const Tensor& dx);
// dx (N, H, W, C, f32) = dx_sub (ConvPlan::dx_sub) at every stride-th pixel of every stride-th
// row, 0 elsewhere.
void Spread(const ConvPlan& p, const Tensor& dx_sub, const Tensor& dx);
// Fills cols (ConvPlan::cols_md) from x (f32 or bf16, NHWC).
void Unfold(const ConvPlan& p, const Tensor& x, const Tensor& cols);
// dx (N, H, W, C, f32) = the sum of dcols' entries of each input pixel: Unfold's transpose.
void Col2Im(const ConvPlan& p, const Tensor& dcols, const Tensor& dx);
// Whether TileWeightGradient runs on this CPU, as oneDNN sees it (DNNL_MAX_CPU_ISA included):
// on AMX bf16 tiles (with Linux's permission for the tile state, asked for once), else on
// AVX512-BF16 dot products (with AVX512-VBMI2: TilesByDots).
bool TilesAvailable();
bool TilesByDots();
// The scratch bytes TileWeightGradient needs for `d` on up to `threads` threads.
size_t TileScratchBytes(const Conv2dDesc& d, int threads);
// dw (K, C, R, S) and db (K; null: no bias), f32, = or += (accumulate) the weight gradient of
// conv2d `d` (CpuBackend::TilesWeightGradient) from x (N, H, W, C) and dy (N, OH, OW, K), each
// bf16 or f32 as d.x_bf16 and d.dy_bf16 say (f32 rounded to bf16 as the staging rounds it), on up
// to `threads` threads in `scratch` (TileScratchBytes). Images are summed in at most 8 fixed
// blocks, the blocks in double in order, or for a large weight in order into one sum: the same
// bits on any thread count.
void TileWeightGradient(const Conv2dDesc& d, const void* x, const void* dy, const Tensor& scratch,
                        int threads, float* dw, float* db, bool accumulate);
// out (C, K, R, S) = w (K, C, R, S) with K and C swapped and each R x S kernel rotated 180 degrees:
// the kernel whose forward convolution of dy is w's input gradient (WeightedPlan::data_flip).
void FlipKernel(const Tensor& w, const Tensor& out);

struct LinearPlan final : WeightedPlan {
  LinearDesc d;
};

// Average pooling runs on dptrain's own loops over the window arithmetic the CUDA kernels share
// (core/pool_window.h), which has PyTorch's divisor in ceil mode (oneDNN's include-padding average
// divides by kernel^2 there); so does channels-last max pooling with windows up to 16 x 16 (`own`:
// oneDNN 2.6's channels-last max pooling ran at a third of the speed of a pass over memory here);
// other max pooling on oneDNN primitives. `g` is set for all.
struct PoolPlan final : OpPlan {
  PoolDesc d;
  ew::PoolGeom g{};
  bool own = false;  // max pooling on the loops of cpu_pool.cc (workspace: a window index a byte)
  bool pair_rows = false;  // `own` with 2 x 2 windows at stride 2, none clipped, C % 16 == 0
  // For `own`, per column: the clipped window [lo, hi) of each output column and its unclipped
  // first column (start); the output columns [lo, hi) whose windows hold each input column.
  struct Columns {
    std::vector<int64_t> lo, hi, start;
  };
  Columns window, cover;
  memory::desc x_md, y_md;
  dnnl::pooling_forward::primitive_desc train_pd, infer_pd;
  dnnl::pooling_backward::primitive_desc bwd_pd;
  dnnl::pooling_forward train, infer;
  dnnl::pooling_backward bwd;
  // PoolDesc::dx_bf16: dy rounded into dy_bf16 (a reorder), then the backward in bf16 (bwd_pd
  // and bwd then run on bf16 operands, reading the f32 forward's workspace).
  Tensor dy_bf16;
  dnnl::reorder dy_to_bf16;
};

// Plan-cache keys: every field of the descriptor that changes the primitives.
inline auto ConvKey(const Conv2dDesc& d) {
  return std::make_tuple(d.n, d.c, d.h, d.w, d.k, d.r, d.s, d.stride, d.pad, d.bias,
                         static_cast<int>(d.precision), d.groups, d.dilation, d.relu, d.x_nhwc,
                         d.y_nhwc, d.dy_bf16, d.x_bf16, d.y_bf16, d.dx_sub);
}
inline auto LinearKey(const LinearDesc& d) {
  return std::make_tuple(d.n, d.in, d.out, d.bias, static_cast<int>(d.precision));
}
inline auto PoolKey(const PoolDesc& d) {
  return std::make_tuple(static_cast<int>(d.kind), d.n, d.c, d.h, d.w, d.kernel, d.stride, d.pad,
                         d.ceil_mode, d.count_include_pad, d.nhwc, d.y_nchw, d.dx_bf16);
}

struct CpuBackend::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mu;  // guards the caches (Prepare may be called from several threads in tests)
  std::map<decltype(ConvKey({})), std::shared_ptr<ConvPlan>> conv;
  std::map<decltype(LinearKey({})), std::shared_ptr<LinearPlan>> linear;
  std::map<decltype(PoolKey({})), std::shared_ptr<PoolPlan>> pool;
  // One scratchpad shared by all primitives (they run one at a time on one stream). Plans reserve
  // it when they are made; ReleasePlans drops it while layers may still hold plans, so running a
  // primitive reserves it again if it is gone (or too small).
  Tensor scratchpad;
  // One buffer for what a convolution writes and reads within one pass and never after (ConvPlan:
  // a strided convolution's unfolded input in its weight gradient, dcols, dx_sub, the input
  // gradient's phases), shared by all
  // plans and reserved as the scratchpad is: the memory stays warm from one layer to the next
  // instead of a cold buffer per plan.
  Tensor transient;
  CpuBackend* owner = nullptr;
  bool winograd = false;          // train.winograd (guarded by mu)
  bool winograd_planned = false;  // a convolution planned by Winograd since it was set (mu)

  void Reserve(CpuBackend& be, const memory::desc& md);
  void ReserveTransient(CpuBackend& be, size_t bytes);
  // The transient buffer's first bytes as a tensor (reserved again if gone or too small).
  Tensor Transient(const Shape& shape, DType dtype);
  // A cached conv2d / linear plan handed to one more layer: while the cache and the layers
  // holding it (slot.use_count(), the caller not yet among them) outnumber its staged copies of
  // x, one more, so that every layer's backward finds the input its forward staged.
  // Not for a convolution whose weight gradient reads its unfolded input instead (ConvPlan::
  // unfold) or the caller's x (ConvPlan::tiles): its backward reads no staged x.
  template <class P>
  std::shared_ptr<P> Shared(CpuBackend& be, const std::shared_ptr<P>& slot) {
    if constexpr (std::is_same_v<P, ConvPlan>) {
      if (slot->unfold || slot->tiles) return slot;
    }
    while (static_cast<long>(slot->f_x.copies.size()) < slot.use_count()) {
      const size_t added = slot->f_x.AddCopy(be);
      if (added == 0) break;
      slot->held_bytes += added;
    }
    return slot;
  }
  memory Mem(const memory::desc& md, const Tensor& t) const { return memory(md, engine, t.raw()); }
  memory Scratch(const memory::desc& md) {
    if (md.get_size() > 0) Reserve(*owner, md);
    return memory(md, engine, scratchpad.defined() ? scratchpad.raw() : nullptr);
  }

  // One pass's primitive and the layouts it reads its two operands (a, b) and writes its result
  // in, as the plan's dims: forward x, w -> y; backward data dy, w -> dx; backward weights
  // x, dy -> dw.
  struct PassPrimitive {
    dnnl::primitive prim;
    memory::desc a, b, out, scratch;
    memory::desc b_user = {};  // b's caller layout when it is not the plan's w (the flipped w)
    template <class Pd>
    static PassPrimitive Forward(const Pd& pd) {
      return {dnnl::primitive(pd), pd.src_desc(), pd.weights_desc(), pd.dst_desc(),
              pd.scratchpad_desc()};
    }
    template <class Pd>
    static PassPrimitive Data(const Pd& pd) {
      return {dnnl::primitive(pd), pd.diff_dst_desc(), pd.weights_desc(), pd.diff_src_desc(),
              pd.scratchpad_desc()};
    }
    template <class Pd>
    static PassPrimitive Weights(const Pd& pd) {
      return {dnnl::primitive(pd), pd.src_desc(), pd.diff_dst_desc(), pd.diff_weights_desc(),
              pd.scratchpad_desc()};
    }
  };

  // Completes a conv2d / linear plan from its three passes: the staging between the caller's
  // layouts (x_user, f32 or bf16 for Conv2dDesc::x_bf16; y_user, f32 or bf16 for
  // Conv2dDesc::y_bf16; dx_user, w_user, f32; dy_user, f32 or bf16 for Conv2dDesc::dy_bf16) and
  // the primitives' own, the scratchpad, the weight-gradient accumulators. `op` names the buffers
  // ("conv2d").
  void Finish(CpuBackend& be, WeightedPlan* p, const std::string& op, bool half,
              const PassPrimitive& fwd, const PassPrimitive& data, const PassPrimitive& weights,
              const memory::desc& x_user, const memory::desc& dx_user, const memory::desc& w_user,
              const memory::desc& y_user, const memory::desc& dy_user, const Shape& w_shape) {
    p->fwd = fwd.prim;
    p->bwd_data = data.prim;
    p->bwd_w = weights.prim;
    p->fwd_scratch = fwd.scratch;
    p->data_scratch = data.scratch;
    p->weights_scratch = weights.scratch;
    const bool in = true;
    p->f_x.Init(be, engine, x_user, fwd.a, op + " staged input", half, in);
    p->f_w.Init(be, engine, w_user, fwd.b, op + " staged weight", half, in);
    p->f_y.Init(be, engine, y_user, fwd.out, op + " staged output", half);
    p->w_x.Init(be, engine, x_user, weights.a, op + " staged input", half, in);
    p->w_dy.Init(be, engine, dy_user, weights.b, op + " staged dy", half, in);
    // Backward data reads dy from the weight gradient's staging when both read one layout
    // (DyForData), and a separate call restages it there: one buffer for both.
    p->d_dy.Init(be, engine, dy_user, data.a, op + " staged dy", half, in, &p->w_dy);
    p->d_w.Init(be, engine, data.b_user == memory::desc() ? w_user : data.b_user, data.b,
                op + " staged weight", half, in);
    p->d_dx.Init(be, engine, dx_user, data.out, op + " staged dx", half);
    p->w_dw.Init(be, engine, w_user, weights.out, op + " staged dw", half);
    Reserve(be, p->fwd_scratch);
    Reserve(be, p->data_scratch);
    Reserve(be, p->weights_scratch);
    p->acc_w = be.Empty(w_shape, DType::kF32, op + " weight-grad accumulator");
    if (p->bias) p->acc_b = be.Empty(Shape{w_shape[0]}, DType::kF32, op + " bias-grad accumulator");
    p->held_bytes = HeldBytes(
        {&p->f_x, &p->f_w, &p->f_y, &p->d_dy, &p->d_w, &p->d_dx, &p->w_x, &p->w_dy, &p->w_dw},
        {&p->acc_w, &p->acc_b, &p->w_flip});
  }

  void Forward(const WeightedPlan& p, const Tensor& x, const Tensor& w, const Tensor* b, Tensor* y);
  void BackwardData(const WeightedPlan& p, const Tensor& dy, const Tensor& w, Tensor* dx) {
    BackwardData(p, p.d_dy.In(engine, stream, dy), DataW(p, w, false), dx);
  }
  // w as the data pass reads it: flipped (WeightedPlan::data_flip) and staged, or staged, or
  // (with `from_forward`) as the forward staged it (FromForward).
  memory DataW(const WeightedPlan& p, const Tensor& w, bool from_forward) {
    if (p.data_flip) {
      FlipKernel(w, p.w_flip);
      return p.d_w.In(engine, stream, p.w_flip);
    }
    return from_forward ? FromForward(p.f_w, p.d_w, w) : p.d_w.In(engine, stream, w);
  }
  void BackwardWeights(const WeightedPlan& p, const Tensor& x, const Tensor& dy, Tensor* dw,
                       Tensor* db, bool accumulate) {
    BackwardWeights(p, WeightsX(p, x, false), p.w_dy.In(engine, stream, dy), dy, dw, db,
                    accumulate);
  }
  // x as the weight-gradient primitive reads it: unfolded (ConvPlan::unfold), or staged, or (with
  // `from_forward`) as the forward staged it (FromForward).
  memory WeightsX(const WeightedPlan& p, const Tensor& x, bool from_forward) {
    const auto* conv = dynamic_cast<const ConvPlan*>(&p);
    if (conv != nullptr && conv->unfold) {
      // the forward's columns when the plan's last forward unfolded this very tensor
      // (FromForward's promise); only a `gemm` plan's forward unfolds
      if (!conv->gemm) {  // unfolded here, read by the weight-gradient GEMM alone
        const Tensor cols =
            Transient(Shape{static_cast<int64_t>(conv->cols_md.get_size() / 2)}, DType::kBF16);
        Unfold(*conv, x, cols);
        return memory(conv->cols_md, engine, cols.raw());
      }
      if (!from_forward || conv->cols_x != x.raw()) {
        conv->cols_x = nullptr;
        Unfold(*conv, x, conv->cols);
      }
      return memory(conv->cols_md, engine, conv->cols.raw());
    }
    return from_forward ? FromForward(p.f_x, p.w_x, x) : p.w_x.In(engine, stream, x);
  }
  // The same from operands already in the primitive's layouts (from the plan's Staged::In).
  void BackwardData(const WeightedPlan& p, const memory& dy_in, const memory& w_in, Tensor* dx);
  // dy: the caller's (a matmul plan sums the bias gradient from it).
  void BackwardWeights(const WeightedPlan& p, const memory& x_in, const memory& dy_in,
                       const Tensor& dy, Tensor* dw, Tensor* db, bool accumulate);
  // What BackwardWeights does after its primitive wrote w_out: a matmul plan's bias gradient
  // into b_out, and with `accumulate` both added into dw and db.
  void FinishWeights(const WeightedPlan& p, const memory& dy_in, const Tensor& dy,
                     const Tensor& b_out, Tensor* dw, Tensor* db, bool accumulate);
  // Operands for both backward passes in a row (Backend::Conv2dBackward's contract): x and w as
  // the forward staged them when the plan's last forward staged these very tensors in the
  // layout the backward primitive reads; dy for the data gradient as the weight gradient's
  // staging left it when both primitives read it in one layout. Each reorder skipped costs
  // about what a small convolution's pass does (a 64x16x32x32 activation: 0.2 ms on 2 cores).
  memory FromForward(const Staged& fwd, const Staged& bwd, const Tensor& t) {
    const bool staged = fwd.ReadsLike(bwd) && fwd.Holds(t);
    return staged ? fwd.Again(engine, t) : bwd.In(engine, stream, t);
  }
  memory DyForData(const WeightedPlan& p, const Tensor& dy, const memory& weights_dy) {
    return p.d_dy.ReadsLike(p.w_dy) ? weights_dy : p.d_dy.In(engine, stream, dy);
  }
};

// True when `p` can run here: fp32 and emulated fp16 always, bf16 when oneDNN has bf16 kernels
// for this CPU (probed once).
bool PrecisionOk(Precision p);

}  // namespace dptrain::cpu
