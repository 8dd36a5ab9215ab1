// SPDX-License-Identifier: Apache-2.0
// dptrain's CUDA kernels. Elementwise bodies call core/elementwise.h (the code the CPU backend
// runs), so numerics match the reference loop for loop. Reductions are two-pass with a block count
// that depends only on the size, which makes them deterministic (bit-identical across runs and
// ranks) without atomics on floating-point values. Pooling backward gathers per input element
// instead of scattering with atomics, for the same reason.
//
// One file on purpose, over the ~400-line guide: nvcc compiles every .cu once per architecture in
// CMAKE_CUDA_ARCHITECTURES, so one unit keeps the build fast. It reads in sections: block
// reductions, elementwise, pooling, batch norm, losses, optimizers, two-pass reductions, and the
// launchers last.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_rules.h"
#include "core/cuda/kernels.h"

namespace dptrain::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 512;

unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 1 << 20));
}

#define DPT_GRID_LOOP(i, n)                                                              \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Launch + launch check. Arguments after the stream are the kernel's.
#define DPT_LAUNCH(kernel, grid, block, stream, ...)       \
  do {                                                     \
    kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__); \
    DPT_CUDA_CHECK_LAUNCH(#kernel);                        \
  } while (false)

// ---- block reductions (blockDim.x a multiple of 32, at most 1024) ------------------------------

template <class T>
__device__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block, returned to every thread. Fixed combination order: deterministic.
template <class T>
__device__ T BlockSum(T v) {
  __shared__ T shared[32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const unsigned warps = (blockDim.x + 31) / 32;
  v = threadIdx.x < warps ? shared[threadIdx.x] : T(0);
  if (warp == 0) v = WarpSum(v);
  __syncthreads();
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  v = shared[0];
  __syncthreads();  // `shared` may be reused by the next call
  return v;
}

// ---- elementwise --------------------------------------------------------------------------------

__global__ void FillKernel(float* p, int64_t n, float v) { DPT_GRID_LOOP(i, n) p[i] = v; }
__global__ void ReluKernel(const float* x, float* y, int64_t n) {
  DPT_GRID_LOOP(i, n) y[i] = ew::Relu(x[i]);
}
__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, int64_t n) {
  DPT_GRID_LOOP(i, n) dx[i] = ew::ReluGrad(y[i], dy[i]);
}
__global__ void ActivateKernel(ew::Activation f, const float* x, float* y, int64_t n) {
  DPT_GRID_LOOP(i, n) y[i] = ew::Activate(f, x[i]);
}
__global__ void ActivateBackwardKernel(ew::Activation f, const float* x, const float* y,
                                       const float* dy, float* dx, int64_t n) {
  DPT_GRID_LOOP(i, n) dx[i] = ew::ActivateGrad(f, x[i], y[i], dy[i]);
}
__global__ void AddKernel(const float* a, const float* b, float* y, int64_t n) {
  DPT_GRID_LOOP(i, n) y[i] = a[i] + b[i];
}
__global__ void AddReluKernel(const float* a, const float* b, float* y, int64_t n) {
  DPT_GRID_LOOP(i, n) y[i] = ew::Relu(a[i] + b[i]);
}
__global__ void MulRowsKernel(const float* x, const float* sc, float* y, int64_t n, int64_t cols) {
  DPT_GRID_LOOP(i, n) y[i] = x[i] * sc[i / cols];
}
__global__ void AddRowsKernel(const float* x, const float* sc, float* y, int64_t n, int64_t cols) {
  DPT_GRID_LOOP(i, n) y[i] = x[i] + sc[i / cols];
}
// One warp per row (grid-stride over rows): lanes take strided columns, then a fixed shuffle
// tree; deterministic. x = nullptr: the plain row sum.
__global__ void RowDotKernel(const float* dy, const float* x, float* ds, int64_t rows,
                             int64_t cols) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t lane = threadIdx.x & 31;
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows;
       r += warps) {
    double acc = 0;
    for (int64_t j = lane; j < cols; j += 32) {
      acc += static_cast<double>(dy[r * cols + j]) * (x != nullptr ? x[r * cols + j] : 1.f);
    }
    acc = WarpSum(acc);
    if (lane == 0) ds[r] = static_cast<float>(acc);
  }
}
__global__ void Pad2dKernel(const float* x, float* y, int64_t planes, int64_t h, int64_t w,
                            int64_t out_h, int64_t out_w, int64_t top, int64_t left) {
  DPT_GRID_LOOP(e, planes * out_h * out_w) {
    const int64_t plane = e / (out_h * out_w), pos = e % (out_h * out_w);
    y[e] = ew::ShiftedAt(x + plane * h * w, h, w, top, left, pos / out_w, pos % out_w);
  }
}
__global__ void ScaleKernel(float* p, int64_t n, float alpha) { DPT_GRID_LOOP(i, n) p[i] *= alpha; }
__global__ void AddIntoKernel(const float* x, float* y, int64_t n) {
  DPT_GRID_LOOP(i, n) y[i] += x[i];
}
__global__ void DropoutKernel(const float* x, float* y, int64_t n, float p, uint64_t seed) {
  DPT_GRID_LOOP(i, n) y[i] = ew::Dropout(x[i], seed, static_cast<uint64_t>(i), p);
}

__global__ void F32ToBf16Kernel(const float* x, uint16_t* y, int64_t n) {
  DPT_GRID_LOOP(i, n) y[i] = ew::FloatToBf16(x[i]);
}
__global__ void Bf16ToF32Kernel(const uint16_t* x, float* y, int64_t n, bool accumulate) {
  DPT_GRID_LOOP(i, n) {
    const float v = ew::Bf16ToFloat(x[i]);
    y[i] = accumulate ? y[i] + v : v;
  }
}
__global__ void F32ToF16Kernel(const float* x, __half* y, int64_t n) {
  DPT_GRID_LOOP(i, n) y[i] = __float2half_rn(x[i]);
}
__global__ void F16ToF32Kernel(const __half* x, float* y, int64_t n, bool accumulate) {
  DPT_GRID_LOOP(i, n) {
    const float v = __half2float(x[i]);
    y[i] = accumulate ? y[i] + v : v;
  }
}

__device__ inline float Widen(float v) { return v; }
__device__ inline float Widen(uint16_t v) { return ew::Bf16ToFloat(v); }
__device__ inline float Widen(__half v) { return __half2float(v); }

// ---- conversions between element types and layouts (Convert): (planes, c, hw) <-> (planes, hw,
// c) through 32 x 32 tiles in shared memory, so that both the read and the write run along
// contiguous memory; element by element when the layouts agree ----------------------------------

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // blockDim = (kTile, kTileRows): each thread moves 4 elements

__device__ inline void Narrow(float v, float* out) { *out = v; }
__device__ inline void Narrow(float v, uint16_t* out) { *out = ew::FloatToBf16(v); }
__device__ inline void Narrow(float v, __half* out) { *out = __float2half_rn(v); }

// v [+ b[ci]], max(., 0) when relu, [added to *out when accumulate], stored as out's type.
template <class D>
__device__ inline void Finish(float v, const float* b, int64_t ci, bool relu, bool accumulate,
                              D* out) {
  if (b != nullptr) v += b[ci];
  if (relu) v = ew::Relu(v);
  if (accumulate) v += Widen(*out);
  Narrow(v, out);
}

// y (planes, hw, c) = [y +] convert(x (planes, c, hw)) [+ b[c]], max(., 0) when relu.
// grid: (tiles along hw, tiles along c, planes in steps of gridDim.z)
template <class S, class D>
__global__ void ToChannelsLastKernel(const S* x, const float* b, bool relu, bool accumulate, D* y,
                                     int64_t planes, int64_t c, int64_t hw) {
  __shared__ float tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed read
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int64_t n = blockIdx.z; n < planes; n += gridDim.z) {
    const S* xb = x + n * c * hw;
    D* yb = y + n * c * hw;
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {  // rows of c, along hw
      const int64_t ci = c0 + k, pi = p0 + threadIdx.x;
      if (ci < c && pi < hw) tile[k][threadIdx.x] = Widen(xb[ci * hw + pi]);
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {  // rows of hw, along c
      const int64_t pi = p0 + k, ci = c0 + threadIdx.x;
      if (pi < hw && ci < c)
        Finish(tile[threadIdx.x][k], b, ci, relu, accumulate, &yb[pi * c + ci]);
    }
    __syncthreads();
  }
}

// y (planes, c, hw) = [y +] convert(x (planes, hw, c)) [+ b[c]], then max(., 0) when relu.
template <class S, class D>
__global__ void FromChannelsLastKernel(const S* x, const float* b, bool relu, bool accumulate, D* y,
                                       int64_t planes, int64_t c, int64_t hw) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int64_t n = blockIdx.z; n < planes; n += gridDim.z) {
    const S* xb = x + n * c * hw;
    D* yb = y + n * c * hw;
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {  // rows of hw, along c
      const int64_t pi = p0 + k, ci = c0 + threadIdx.x;
      if (pi < hw && ci < c) tile[k][threadIdx.x] = Widen(xb[pi * c + ci]);
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {  // rows of c, along hw
      const int64_t ci = c0 + k, pi = p0 + threadIdx.x;
      if (ci < c && pi < hw)
        Finish(tile[threadIdx.x][k], b, ci, relu, accumulate, &yb[ci * hw + pi]);
    }
    __syncthreads();
  }
}

// The same layout on both sides: element by element (in place when x == y and S == D, without
// accumulate).
template <class S, class D>
__global__ void ConvertKernel(const S* x, const float* b, bool relu, bool accumulate, D* y,
                              int64_t c, int64_t hw, bool nhwc, int64_t total) {
  DPT_GRID_LOOP(i, total) {
    Finish(Widen(x[i]), b, nhwc ? i % c : (i / hw) % c, relu, accumulate, &y[i]);
  }
}

dim3 ChannelsLastGrid(int64_t planes, int64_t c, int64_t hw) {
  const auto tiles = [](int64_t n) { return static_cast<unsigned>((n + kTile - 1) / kTile); };
  DPT_CHECK((c + kTile - 1) / kTile <= 65535)
      << "channels-last tiles: " << c << " channels exceed the grid's y (65535 tiles of " << kTile
      << ")";
  return dim3(tiles(hw), tiles(c), static_cast<unsigned>(std::min<int64_t>(planes, 65535)));
}

__global__ void AddBiasRowsKernel(float* y, const float* b, int64_t rows, int64_t cols) {
  DPT_GRID_LOOP(i, rows * cols) y[i] += b[i % cols];
}
__global__ void ColumnSumsKernel(const float* dy, int64_t rows, int64_t cols, float* db,
                                 bool accumulate) {
  DPT_GRID_LOOP(j, cols) {
    double s = 0;
    for (int64_t i = 0; i < rows; ++i) s += dy[i * cols + j];
    db[j] = static_cast<float>(s) + (accumulate ? db[j] : 0.f);
  }
}

// ---- pooling ------------------------------------------------------------------------------------

// Every kernel runs over its output in memory order (coalesced in either layout): the plane and
// position of each element come from ew::PlanePosition, x and y each in their own layout
// (PoolLayout).
__global__ void MaxPoolForwardKernel(PoolGeom g, PoolLayout l, const float* x, float* y,
                                     int32_t* argmax) {
  const int64_t step = ew::PlaneStep(l.c, l.x_nhwc);
  DPT_GRID_LOOP(o, g.planes * g.p * g.q) {
    int64_t plane = 0, rem = 0;
    ew::PlanePosition(o, l.c, g.p * g.q, l.y_nhwc, &plane, &rem);
    const ew::PoolWindow win = ew::WindowOf(g, rem / g.q, rem % g.q);
    const float* in = x + ew::PlaneIndex(plane, 0, l.c, g.h * g.w, l.x_nhwc);
    float best = 0.f;
    int64_t arg = -1;
    for (int64_t ih = win.h0; ih < win.h1; ++ih) {
      for (int64_t iw = win.w0; iw < win.w1; ++iw) {
        const float v = in[(ih * g.w + iw) * step];
        // Strictly greater: the first maximum in row-major window order wins ties. A NaN wins,
        // as in PyTorch, so a diverging model shows it.
        if (arg < 0 || v > best || isnan(v)) {
          best = v;
          arg = ih * g.w + iw;
        }
      }
    }
    y[o] = best;
    if (argmax != nullptr) argmax[o] = static_cast<int32_t>(arg);  // y's layout, x's position
  }
}

// dx f32, or bf16 (PoolDesc::dx_bf16: windows that do not overlap, so each element is one dy value
// or zero, rounded).
template <class D>
__global__ void MaxPoolBackwardKernel(PoolGeom g, PoolLayout l, const float* dy,
                                      const int32_t* argmax, D* dx) {
  DPT_GRID_LOOP(e, g.planes * g.h * g.w) {
    int64_t plane = 0, pos = 0;
    ew::PlanePosition(e, l.c, g.h * g.w, l.x_nhwc, &plane, &pos);
    const ew::PoolCover win = ew::Covering(g, pos / g.w, pos % g.w);
    float s = 0.f;
    for (int64_t p = win.p0; p < win.p1; ++p) {
      for (int64_t q = win.q0; q < win.q1; ++q) {
        const int64_t o = ew::PlaneIndex(plane, p * g.q + q, l.c, g.p * g.q, l.y_nhwc);
        if (argmax[o] == pos) s += dy[o];
      }
    }
    Narrow(s, &dx[e]);
  }
}

__global__ void AvgPoolForwardKernel(PoolGeom g, PoolLayout l, const float* x, float* y) {
  DPT_GRID_LOOP(o, g.planes * g.p * g.q) {
    int64_t plane = 0, rem = 0;
    ew::PlanePosition(o, l.c, g.p * g.q, l.y_nhwc, &plane, &rem);
    y[o] = ew::AvgPoolAt(g, x + ew::PlaneIndex(plane, 0, l.c, g.h * g.w, l.x_nhwc), rem / g.q,
                         rem % g.q, ew::PlaneStep(l.c, l.x_nhwc));
  }
}

__global__ void AvgPoolBackwardKernel(PoolGeom g, PoolLayout l, const float* dy, float* dx) {
  DPT_GRID_LOOP(e, g.planes * g.h * g.w) {
    int64_t plane = 0, pos = 0;
    ew::PlanePosition(e, l.c, g.h * g.w, l.x_nhwc, &plane, &pos);
    dx[e] = ew::AvgPoolGradAt(g, dy + ew::PlaneIndex(plane, 0, l.c, g.p * g.q, l.y_nhwc), pos / g.w,
                              pos % g.w, ew::PlaneStep(l.c, l.y_nhwc));
  }
}

// ---- batch norm: each channel over BatchNormParts() blocks, reduced in part order ------------

constexpr int kBnThreads = 256;
// Each channel's n*hw elements are split over BatchNormParts() blocks (cuda_rules.h).

// Samples [*first, *last) of part `p` of `parts`.
__device__ void BnPartRange(int64_t n, int64_t parts, int64_t p, int64_t* first, int64_t* last) {
  *first = p * n / parts;
  *last = (p + 1) * n / parts;
}

// Calls f(i) for the flat index i of every element of channel ch in samples [n0, n1), each
// thread in a fixed order.
template <class F>
__device__ void BnForEach(int64_t n0, int64_t n1, int64_t c, int64_t hw, int64_t ch, F&& f) {
  if (hw >= blockDim.x) {
    for (int64_t ni = n0; ni < n1; ++ni) {
      const int64_t base = (ni * c + ch) * hw;
      for (int64_t s = threadIdx.x; s < hw; s += blockDim.x) f(base + s);
    }
    return;
  }
  // Small planes (hw < blockDim.x <= 1024): the whole run flattened.
  const int64_t len = (n1 - n0) * hw;
  for (int64_t e = threadIdx.x; e < len; e += blockDim.x) {
    const int64_t q = e / hw;
    f(((n0 + q) * c + ch) * hw + (e - q * hw));
  }
}

// The channel's total of a per-part quantity, in part order (every thread gets the same value).
__device__ double BnTotal(const double* partial, int64_t ch, int64_t parts) {
  double t = 0;
  for (int64_t p = 0; p < parts; ++p) t += partial[ch * parts + p];
  return t;
}

// Pass 1 (sums == nullptr): each part's sum of x. Pass 2: each part's sum of (x - mean)^2 with
// the channel's mean from pass 1 (two passes: no cancellation for data with a large mean).
__global__ void BnStatsKernel(int64_t n, int64_t c, int64_t hw, int64_t parts, const float* x,
                              const double* sums, double* out) {
  const int64_t ch = blockIdx.x, p = blockIdx.y;
  int64_t n0 = 0, n1 = 0;
  BnPartRange(n, parts, p, &n0, &n1);
  const double mean = sums != nullptr ? BnTotal(sums, ch, parts) / static_cast<double>(n * hw) : 0;
  double acc = 0;
  BnForEach(n0, n1, c, hw, ch, [&](int64_t i) {
    const double v = x[i];
    acc += sums != nullptr ? (v - mean) * (v - mean) : v;
  });
  acc = BlockSum(acc);
  if (threadIdx.x == 0) out[ch * parts + p] = acc;
}

__global__ void BnApplyKernel(int64_t n, int64_t c, int64_t hw, int64_t parts, double momentum,
                              double eps, bool relu, const float* x, const float* gamma,
                              const float* beta, const double* sums, const double* sqs,
                              float* running_mean, float* running_var, float* y, float* save_mean,
                              float* save_invstd) {
  const int64_t ch = blockIdx.x, p = blockIdx.y, m = n * hw;
  int64_t n0 = 0, n1 = 0;
  BnPartRange(n, parts, p, &n0, &n1);
  const double mean = BnTotal(sums, ch, parts) / static_cast<double>(m);
  const double var = BnTotal(sqs, ch, parts) / static_cast<double>(m);
  const double invstd = ew::BnInvStd(var, eps);
  // The CPU backend's arithmetic (core/elementwise.h), in the same precisions.
  const ew::BnAffine affine = ew::BnFold(gamma[ch], beta[ch], static_cast<float>(mean), invstd);
  BnForEach(n0, n1, c, hw, ch, [&](int64_t i) {
    const float v = ew::BnApply(x[i], affine);
    y[i] = relu ? ew::Relu(v) : v;
  });
  if (p == 0 && threadIdx.x == 0) {
    save_mean[ch] = static_cast<float>(mean);
    save_invstd[ch] = static_cast<float>(invstd);
    running_mean[ch] = ew::BnRunning(running_mean[ch], mean, momentum);
    running_var[ch] = ew::BnRunning(running_var[ch], ew::BnUnbiasedVar(var, m), momentum);
  }
}

__global__ void BatchNormInferenceKernel(int64_t n, int64_t c, int64_t hw, double eps, bool relu,
                                         const float* x, const float* gamma, const float* beta,
                                         const float* running_mean, const float* running_var,
                                         float* y) {
  const int64_t ch = blockIdx.x, m = n * hw;
  const double invstd = ew::BnInvStd(running_var[ch], eps);
  const ew::BnAffine affine = ew::BnFold(gamma[ch], beta[ch], running_mean[ch], invstd);
  for (int64_t e = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; e < m;
       e += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    const int64_t ni = e / hw;
    const int64_t i = (ni * c + ch) * hw + (e - ni * hw);
    const float v = ew::BnApply(x[i], affine);
    y[i] = relu ? ew::Relu(v) : v;
  }
}

// Each part's sums of dy and of dy * (x - mean) (ew::BnDyXc: f32 terms, double sums).
// dy[i] as the batch norm's own output sees it: gated by the folded ReLU's output when there is
// one (ew::ReluGrad, as the ReLU's backward would).
__device__ float BnGatedDy(const float* dy, const float* relu_y, int64_t i) {
  return relu_y != nullptr ? ew::ReluGrad(relu_y[i], dy[i]) : dy[i];
}

__global__ void BnBackwardSumsKernel(int64_t n, int64_t c, int64_t hw, int64_t parts,
                                     const float* x, const float* dy, const float* relu_y,
                                     const float* save_mean, double* s_dy, double* s_dy_xc) {
  const int64_t ch = blockIdx.x, p = blockIdx.y;
  int64_t n0 = 0, n1 = 0;
  BnPartRange(n, parts, p, &n0, &n1);
  const float mean = save_mean[ch];
  double a = 0, b = 0;
  BnForEach(n0, n1, c, hw, ch, [&](int64_t i) {
    const float g = BnGatedDy(dy, relu_y, i);
    a += g;
    b += ew::BnDyXc(g, x[i], mean);
  });
  a = BlockSum(a);
  b = BlockSum(b);
  if (threadIdx.x == 0) {
    s_dy[ch * parts + p] = a;
    s_dy_xc[ch * parts + p] = b;
  }
}

// dx may be relu_y: each thread reads its element before it writes it.
__global__ void BnBackwardApplyKernel(int64_t n, int64_t c, int64_t hw, int64_t parts,
                                      const float* x, const float* dy, const float* relu_y,
                                      const float* gamma, const float* save_mean,
                                      const float* save_invstd, const double* s_dy_parts,
                                      const double* s_dy_xc_parts, float* dx, float* dgamma,
                                      float* dbeta, bool accumulate) {
  const int64_t ch = blockIdx.x, p = blockIdx.y;
  int64_t n0 = 0, n1 = 0;
  BnPartRange(n, parts, p, &n0, &n1);
  const float mean = save_mean[ch];
  const double invstd = save_invstd[ch];
  const double s_dy = BnTotal(s_dy_parts, ch, parts);
  const ew::BnGradFolded f = ew::BnGradFold(gamma[ch], invstd, static_cast<double>(n * hw), s_dy,
                                            BnTotal(s_dy_xc_parts, ch, parts));
  BnForEach(n0, n1, c, hw, ch,
            [&](int64_t i) { dx[i] = ew::BnDx(BnGatedDy(dy, relu_y, i), x[i], mean, f.dx); });
  if (p == 0 && threadIdx.x == 0) {
    dgamma[ch] = ew::BnParamGrad(f.sum_dy_xhat, dgamma[ch], accumulate);
    dbeta[ch] = ew::BnParamGrad(s_dy, dbeta[ch], accumulate);
  }
}

// ---- batch norm, channels-last: x as (m = N * HW rows, c), blocks of 32 channels x 8 row lanes
// over BatchNormNhwcParts() parts of the rows; a warp reads 32 neighbouring channels of one row
// (contiguous). One pass over x for the statistics (ew::BnShiftedMoments: sums of x - shift and
// its square, shift the channel's value in row 0), one small per-channel kernel that folds them
// (the mean, the variance, the scale and shift; the running and saved statistics), one pass that
// applies them. Each channel's per-part sums are reduced over the row lanes, then over the parts,
// in a fixed order. x, y, the ReLU gate and dx are each f32 or bf16 (Widen / Narrow); dy is f32.

constexpr int kBnTileC = 32, kBnTileRows = 8;

// The sum of v over the block's row lanes (threadIdx.y), in their order, valid in row lane 0.
__device__ double BnRowLaneSum(double v) {
  __shared__ double lanes[kBnTileRows][kBnTileC];
  lanes[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  double t = 0;
  if (threadIdx.y == 0) {
    for (int k = 0; k < kBnTileRows; ++k) t += lanes[k][threadIdx.x];
  }
  __syncthreads();  // `lanes` may be reused by the next call
  return t;
}

// Each part's sums of d = x - shift and of d^2, shift = x[0, ch].
template <class TX>
__global__ void BnNhwcStatsKernel(int64_t m, int64_t c, int64_t parts, const TX* x, double* s1,
                                  double* s2) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kBnTileC + threadIdx.x, p = blockIdx.y;
  int64_t r0 = 0, r1 = 0;
  BnPartRange(m, parts, p, &r0, &r1);
  double a = 0, b = 0;
  if (ch < c) {
    const double shift = Widen(x[ch]);
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kBnTileRows) {
      const double d = static_cast<double>(Widen(x[r * c + ch])) - shift;
      a += d;
      b += d * d;
    }
  }
  a = BnRowLaneSum(a);
  b = BnRowLaneSum(b);
  if (threadIdx.y == 0 && ch < c) {
    s1[ch * parts + p] = a;
    s2[ch * parts + p] = b;
  }
}

// Per channel: the statistics from the parts' sums, folded into `affine` (scale, then shift, 2 x c:
// the apply kernel's, or a deferred batch norm's output), the saved statistics and the running
// ones. Runs before the apply kernel writes y, which may be x.
template <class TX>
__global__ void BnNhwcFoldKernel(int64_t m, int64_t c, int64_t parts, double momentum, double eps,
                                 const TX* x, const float* gamma, const float* beta,
                                 const double* s1, const double* s2, float* running_mean,
                                 float* running_var, float* affine, float* save_mean,
                                 float* save_invstd) {
  DPT_GRID_LOOP(ch, c) {
    const ew::BnMoments mo = ew::BnShiftedMoments(Widen(x[ch]), BnTotal(s1, ch, parts),
                                                  BnTotal(s2, ch, parts), static_cast<double>(m));
    const double invstd = ew::BnInvStd(mo.var, eps);
    const ew::BnAffine a = ew::BnFold(gamma[ch], beta[ch], static_cast<float>(mo.mean), invstd);
    affine[ch] = a.scale;
    affine[c + ch] = a.shift;
    save_mean[ch] = static_cast<float>(mo.mean);
    save_invstd[ch] = static_cast<float>(invstd);
    running_mean[ch] = ew::BnRunning(running_mean[ch], mo.mean, momentum);
    running_var[ch] = ew::BnRunning(running_var[ch], ew::BnUnbiasedVar(mo.var, m), momentum);
  }
}

// y = BnApply(x, affine) (then ReLU) per channel; in training `affine` is the fold kernel's, in
// inference the running statistics' (BnAffineInferenceKernel).
template <class TX, class TY>
__global__ void BnNhwcApplyKernel(int64_t m, int64_t c, int64_t parts, bool relu, const TX* x,
                                  const float* affine, TY* y) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kBnTileC + threadIdx.x, p = blockIdx.y;
  if (ch >= c) return;  // no barrier below
  int64_t r0 = 0, r1 = 0;
  BnPartRange(m, parts, p, &r0, &r1);
  const ew::BnAffine a{affine[ch], affine[c + ch]};
  for (int64_t r = r0 + threadIdx.y; r < r1; r += kBnTileRows) {
    const float v = ew::BnApply(Widen(x[r * c + ch]), a);
    Narrow(relu ? ew::Relu(v) : v, &y[r * c + ch]);
  }
}

// The scale and shift of inference, from the running statistics (the deferred batch norm's
// BatchNormAffineInference, and the apply kernel's in inference).
__global__ void BnAffineInferenceKernel(int64_t c, double eps, const float* gamma,
                                        const float* beta, const float* running_mean,
                                        const float* running_var, float* affine) {
  DPT_GRID_LOOP(ch, c) {
    const ew::BnAffine a =
        ew::BnFold(gamma[ch], beta[ch], running_mean[ch], ew::BnInvStd(running_var[ch], eps));
    affine[ch] = a.scale;
    affine[c + ch] = a.shift;
  }
}

// dy as the batch norm's own output sees it: dy + dy2 where the gradient comes in two parts
// (dy2 non-null: BatchNormBackwardSum, summed in f32 in that order), gated by the folded ReLU's
// output (relu_y, f32 or bf16: a bf16 y is zero exactly where the f32 one is) when there is one.
template <class TG>
__device__ float BnNhwcGatedDy(const float* dy, const float* dy2, const TG* relu_y, int64_t i) {
  const float g = dy2 != nullptr ? dy[i] + dy2[i] : dy[i];
  return relu_y != nullptr ? ew::ReluGrad(Widen(relu_y[i]), g) : g;
}

// Each part's sums of dy and of dy * (x - mean) (ew::BnDyXc: f32 terms, double sums).
template <class TX, class TG>
__global__ void BnNhwcBackwardSumsKernel(int64_t m, int64_t c, int64_t parts, const TX* x,
                                         const float* dy, const float* dy2, const TG* relu_y,
                                         const float* save_mean, double* s_dy, double* s_dy_xc) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kBnTileC + threadIdx.x, p = blockIdx.y;
  int64_t r0 = 0, r1 = 0;
  BnPartRange(m, parts, p, &r0, &r1);
  double a = 0, b = 0;
  if (ch < c) {
    const float mean = save_mean[ch];
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kBnTileRows) {
      const int64_t i = r * c + ch;
      const float g = BnNhwcGatedDy(dy, dy2, relu_y, i);
      a += g;
      b += ew::BnDyXc(g, Widen(x[i]), mean);
    }
  }
  a = BnRowLaneSum(a);
  b = BnRowLaneSum(b);
  if (threadIdx.y == 0 && ch < c) {
    s_dy[ch * parts + p] = a;
    s_dy_xc[ch * parts + p] = b;
  }
}

// Per channel: the sums folded into dx's terms (3 x c: a, b, c of ew::BnDxTerms) and the
// parameter gradients.
__global__ void BnNhwcBackwardFoldKernel(int64_t m, int64_t c, int64_t parts, const float* gamma,
                                         const float* save_invstd, const double* s_dy_parts,
                                         const double* s_dy_xc_parts, float* terms, float* dgamma,
                                         float* dbeta, bool accumulate) {
  DPT_GRID_LOOP(ch, c) {
    const double s_dy = BnTotal(s_dy_parts, ch, parts);
    const ew::BnGradFolded f = ew::BnGradFold(gamma[ch], save_invstd[ch], static_cast<double>(m),
                                              s_dy, BnTotal(s_dy_xc_parts, ch, parts));
    terms[ch] = f.dx.a;
    terms[c + ch] = f.dx.b;
    terms[2 * c + ch] = f.dx.c;
    dgamma[ch] = ew::BnParamGrad(f.sum_dy_xhat, dgamma[ch], accumulate);
    dbeta[ch] = ew::BnParamGrad(s_dy, dbeta[ch], accumulate);
  }
}

// dx may be relu_y (both f32): each thread reads its element before it writes it.
template <class TX, class TG, class TD>
__global__ void BnNhwcBackwardApplyKernel(int64_t m, int64_t c, int64_t parts, const TX* x,
                                          const float* dy, const float* dy2, const TG* relu_y,
                                          const float* save_mean, const float* terms, TD* dx) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kBnTileC + threadIdx.x, p = blockIdx.y;
  if (ch >= c) return;
  int64_t r0 = 0, r1 = 0;
  BnPartRange(m, parts, p, &r0, &r1);
  const float mean = save_mean[ch];
  const ew::BnDxTerms t{terms[ch], terms[c + ch], terms[2 * c + ch]};
  for (int64_t r = r0 + threadIdx.y; r < r1; r += kBnTileRows) {
    const int64_t i = r * c + ch;
    Narrow(ew::BnDx(BnNhwcGatedDy(dy, dy2, relu_y, i), Widen(x[i]), mean, t), &dx[i]);
  }
}

// y = f0(x0) + f1(x1), max(., 0) when relu, f_k(x) = ew::BnApply(x, affine_k) per channel where
// affine_k is given (scale then shift, 2 x c), x itself where null; channels-last, so channel
// i % c. Each term as the batch norm's apply kernel computes it, summed in f32, rounded to y's
// type.
template <class X0, class X1, class Y>
__global__ void AffineAddKernel(const X0* x0, const float* a0, const X1* x1, const float* a1,
                                bool relu, Y* y, int64_t c, int64_t total) {
  DPT_GRID_LOOP(i, total) {
    const int64_t ch = i % c;
    const float p = Widen(x0[i]), q = Widen(x1[i]);
    const float u = a0 != nullptr ? ew::BnApply(p, ew::BnAffine{a0[ch], a0[c + ch]}) : p;
    const float v = a1 != nullptr ? ew::BnApply(q, ew::BnAffine{a1[ch], a1[c + ch]}) : q;
    const float sum = u + v;
    Narrow(relu ? ew::Relu(sum) : sum, &y[i]);
  }
}

// ReLU's backward gated by an f32 or bf16 y, of one gradient or of two parts (dy2 non-null,
// summed in f32 in that order). dx may be y when both are f32.
template <class Y>
__global__ void ReluBackwardTypedKernel(const Y* y, const float* dy, const float* dy2, float* dx,
                                        int64_t n) {
  DPT_GRID_LOOP(i, n) {
    const float g = dy2 != nullptr ? dy[i] + dy2[i] : dy[i];
    dx[i] = ew::ReluGrad(Widen(y[i]), g);
  }
}

// ---- losses -------------------------------------------------------------------------------------

constexpr int kRowsPerBlock = kThreads / 32;  // one warp per row

__global__ void SoftmaxXentKernel(int64_t n, int64_t k, const float* logits, const int32_t* labels,
                                  float eps, float* probs, double* row_loss, int32_t* row_hit,
                                  unsigned long long* bad_label) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (i >= n) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const float* row = logits + i * k;
  // Max and its lowest index (the CPU's first-strictly-greater scan; torch.argmax).
  float mx = -INFINITY;
  int64_t arg = LLONG_MAX;
  for (int64_t j = lane; j < k; j += 32) {
    const float v = row[j];
    if (arg == LLONG_MAX || v > mx) {
      mx = v;
      arg = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, mx, o);
    const int64_t oa = __shfl_xor_sync(0xffffffffu, arg, o);
    if (oa != LLONG_MAX && (arg == LLONG_MAX || om > mx || (om == mx && oa < arg))) {
      mx = om;
      arg = oa;
    }
  }
  double sum = 0, shifted = 0;
  for (int64_t j = lane; j < k; j += 32) {
    sum += exp(static_cast<double>(row[j] - mx));
    shifted += static_cast<double>(row[j] - mx);
  }
  sum = WarpSum(sum);
  shifted = WarpSum(shifted);
  const double inv = 1.0 / sum;
  for (int64_t j = lane; j < k; j += 32) {
    probs[i * k + j] = static_cast<float>(exp(static_cast<double>(row[j] - mx)) * inv);
  }
  if (lane == 0) {
    const int32_t t = labels[i];
    if (t < 0 || t >= k) {
      atomicMin(bad_label, BadLabelCode(i, t));
      row_loss[i] = static_cast<double>(NAN);
      row_hit[i] = 0;
    } else {
      row_loss[i] = ew::SoftmaxXentRow(log(sum), static_cast<double>(row[t] - mx),
                                       shifted / static_cast<double>(k), eps);
      row_hit[i] = arg == t ? 1 : 0;
    }
  }
}

__global__ void SumRowsKernel(int64_t n, const double* row_loss, const int32_t* row_hit,
                              float* loss_sum, float* correct) {
  double l = 0, h = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    l += row_loss[i];
    h += row_hit[i];
  }
  l = BlockSum(l);
  h = BlockSum(h);
  if (threadIdx.x == 0) {
    loss_sum[0] = static_cast<float>(l);
    if (correct != nullptr) correct[0] = static_cast<float>(h);
  }
}

__global__ void SoftmaxXentBackwardKernel(int64_t n, int64_t k, const float* probs,
                                          const int32_t* labels, float eps, float scale,
                                          float* dlogits) {
  DPT_GRID_LOOP(e, n * k) {
    const int64_t i = e / k, j = e % k;
    dlogits[e] = ew::SoftmaxXentGrad(probs[e], j == labels[i], eps, k, scale);
  }
}

__global__ void MseBackwardKernel(const float* y, const float* t, float scale, float* dy,
                                  int64_t n) {
  DPT_GRID_LOOP(i, n) dy[i] = ew::MseGrad(y[i], t[i], scale);
}

// ---- optimizers ---------------------------------------------------------------------------------

__global__ void SgdKernel(ew::SgdHyper h, float* param, const float* grad, float* momentum,
                          int64_t n) {
  DPT_GRID_LOOP(i, n) {
    float unused = 0.f;
    ew::SgdUpdate(h, param + i, grad[i], momentum != nullptr ? momentum + i : &unused);
  }
}

__global__ void AdamWKernel(ew::AdamWHyper h, float* param, const float* grad, float* m, float* v,
                            int64_t n) {
  DPT_GRID_LOOP(i, n) ew::AdamWUpdate(h, param + i, grad[i], m + i, v + i);
}

// ---- reductions ---------------------------------------------------------------------------------

struct SquareOp {
  const float* x;
  __device__ double operator()(int64_t i) const { return static_cast<double>(x[i]) * x[i]; }
};
struct SquaredErrorOp {
  const float* y;
  const float* t;
  __device__ double operator()(int64_t i) const { return ew::SquaredError(y[i], t[i]); }
};
struct NonFiniteOp {
  const float* x;
  __device__ unsigned long long operator()(int64_t i) const { return ew::IsFinite(x[i]) ? 0 : 1; }
};

template <class T, class Op>
__global__ void PartialsKernel(Op op, int64_t n, T* partials) {
  T acc = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc += op(i);
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

template <class T, class Out>
__global__ void FinalKernel(const T* partials, int count, Out* out) {
  T acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = BlockSum(acc);
  if (threadIdx.x == 0) out[0] = static_cast<Out>(acc);
}

// Blocks of the first pass: a function of n only (determinism), at most kMaxPartials.
int PartialBlocks(int64_t n) {
  return static_cast<int>(
      std::clamp<int64_t>((n + kThreads * 8 - 1) / (kThreads * 8), 1, kMaxPartials));
}

template <class T, class Out, class Op>
void Reduce(Op op, int64_t n, T* partials, Out* out, cudaStream_t s) {
  int count = 0;
  if (n > 0) {
    count = PartialBlocks(n);
    PartialsKernel<T, Op><<<count, kThreads, 0, s>>>(op, n, partials);
    DPT_CUDA_CHECK_LAUNCH("PartialsKernel");
  }
  FinalKernel<T, Out><<<1, kThreads, 0, s>>>(partials, count, out);
  DPT_CUDA_CHECK_LAUNCH("FinalKernel");
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------

void Fill(float* p, int64_t n, float value, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(FillKernel, Blocks(n), kThreads, s, p, n, value);
}
void Relu(const float* x, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(ReluKernel, Blocks(n), kThreads, s, x, y, n);
}
void ReluBackward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(ReluBackwardKernel, Blocks(n), kThreads, s, y, dy, dx, n);
}
void Activate(ew::Activation f, const float* x, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(ActivateKernel, Blocks(n), kThreads, s, f, x, y, n);
}
void ActivateBackward(ew::Activation f, const float* x, const float* y, const float* dy, float* dx,
                      int64_t n, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(ActivateBackwardKernel, Blocks(n), kThreads, s, f, x, y, dy, dx, n);
}
void Add(const float* a, const float* b, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(AddKernel, Blocks(n), kThreads, s, a, b, y, n);
}
void AddRelu(const float* a, const float* b, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(AddReluKernel, Blocks(n), kThreads, s, a, b, y, n);
}
void MulRows(const float* x, const float* sc, float* y, int64_t rows, int64_t cols,
             cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n > 0) DPT_LAUNCH(MulRowsKernel, Blocks(n), kThreads, s, x, sc, y, n, cols);
}
void RowDot(const float* dy, const float* x, float* ds, int64_t rows, int64_t cols,
            cudaStream_t s) {
  if (rows > 0) DPT_LAUNCH(RowDotKernel, Blocks(rows * 32), kThreads, s, dy, x, ds, rows, cols);
}
void AddRows(const float* x, const float* sc, float* y, int64_t rows, int64_t cols,
             cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n > 0) DPT_LAUNCH(AddRowsKernel, Blocks(n), kThreads, s, x, sc, y, n, cols);
}
void Pad2d(const float* x, float* y, int64_t planes, int64_t h, int64_t w, int64_t out_h,
           int64_t out_w, int64_t top, int64_t left, cudaStream_t s) {
  const int64_t n = planes * out_h * out_w;
  if (n > 0) {
    DPT_LAUNCH(Pad2dKernel, Blocks(n), kThreads, s, x, y, planes, h, w, out_h, out_w, top, left);
  }
}
void Scale(float* p, int64_t n, float alpha, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(ScaleKernel, Blocks(n), kThreads, s, p, n, alpha);
}
void AddInto(const float* x, float* y, int64_t n, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(AddIntoKernel, Blocks(n), kThreads, s, x, y, n);
}
void Dropout(const float* x, float* y, int64_t n, float p, uint64_t seed, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(DropoutKernel, Blocks(n), kThreads, s, x, y, n, p, seed);
}

void F32ToHalf(Half kind, const float* x, void* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  if (kind == Half::kBF16) {
    DPT_LAUNCH(F32ToBf16Kernel, Blocks(n), kThreads, s, x, static_cast<uint16_t*>(y), n);
  } else {
    DPT_LAUNCH(F32ToF16Kernel, Blocks(n), kThreads, s, x, static_cast<__half*>(y), n);
  }
}
void HalfToF32(Half kind, const void* x, float* y, int64_t n, bool accumulate, cudaStream_t s) {
  if (n == 0) return;
  if (kind == Half::kBF16) {
    DPT_LAUNCH(Bf16ToF32Kernel, Blocks(n), kThreads, s, static_cast<const uint16_t*>(x), y, n,
               accumulate);
  } else {
    DPT_LAUNCH(F16ToF32Kernel, Blocks(n), kThreads, s, static_cast<const __half*>(x), y, n,
               accumulate);
  }
}

// Calls f(T{}) with T the C++ type of elements of type e.
template <class F>
void WithElem(Elem e, F&& f) {
  switch (e) {
    case Elem::kF32:
      f(float{});
      return;
    case Elem::kBF16:
      f(uint16_t{});
      return;
    case Elem::kF16:
      f(__half{});
      return;
  }
}

void Convert(const void* x, Elem xt, bool x_nhwc, void* y, Elem yt, bool y_nhwc, const float* b,
             bool relu, bool accumulate, int64_t planes, int64_t c, int64_t hw, cudaStream_t s) {
  const int64_t total = planes * c * hw;
  if (total == 0) return;
  WithElem(xt, [&](auto sx) {
    WithElem(yt, [&](auto dy) {
      using S = decltype(sx);
      using D = decltype(dy);
      const S* in = static_cast<const S*>(x);
      D* out = static_cast<D*>(y);
      if (x_nhwc == y_nhwc) {
        const auto convert = ConvertKernel<S, D>;
        DPT_LAUNCH(convert, Blocks(total), kThreads, s, in, b, relu, accumulate, out, c, hw, x_nhwc,
                   total);
        return;
      }
      const dim3 grid = ChannelsLastGrid(planes, c, hw), block(kTile, kTileRows);
      if (y_nhwc) {
        const auto to_channels_last = ToChannelsLastKernel<S, D>;
        DPT_LAUNCH(to_channels_last, grid, block, s, in, b, relu, accumulate, out, planes, c, hw);
      } else {
        const auto from_channels_last = FromChannelsLastKernel<S, D>;
        DPT_LAUNCH(from_channels_last, grid, block, s, in, b, relu, accumulate, out, planes, c, hw);
      }
    });
  });
}

void ToChannelsLast(const float* x, float* y, int64_t n, int64_t c, int64_t hw, cudaStream_t s) {
  Convert(x, Elem::kF32, false, y, Elem::kF32, true, nullptr, false, false, n, c, hw, s);
}

void FromChannelsLast(const float* x, float* y, int64_t n, int64_t c, int64_t hw, cudaStream_t s) {
  Convert(x, Elem::kF32, true, y, Elem::kF32, false, nullptr, false, false, n, c, hw, s);
}

void AddBiasRows(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols > 0)
    DPT_LAUNCH(AddBiasRowsKernel, Blocks(rows * cols), kThreads, s, y, b, rows, cols);
}
void ColumnSums(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate,
                cudaStream_t s) {
  if (cols > 0)
    DPT_LAUNCH(ColumnSumsKernel, Blocks(cols), kThreads, s, dy, rows, cols, db, accumulate);
}

void MaxPoolForward(const PoolGeom& g, const PoolLayout& l, const float* x, float* y,
                    int32_t* argmax, cudaStream_t s) {
  const int64_t n = g.planes * g.p * g.q;
  if (n > 0) DPT_LAUNCH(MaxPoolForwardKernel, Blocks(n), kThreads, s, g, l, x, y, argmax);
}
void MaxPoolBackward(const PoolGeom& g, const PoolLayout& l, const float* dy, const int32_t* argmax,
                     void* dx, bool dx_bf16, cudaStream_t s) {
  const int64_t n = g.planes * g.h * g.w;
  if (n == 0) return;
  if (dx_bf16) {
    DPT_LAUNCH(MaxPoolBackwardKernel<uint16_t>, Blocks(n), kThreads, s, g, l, dy, argmax,
               static_cast<uint16_t*>(dx));
  } else {
    DPT_LAUNCH(MaxPoolBackwardKernel<float>, Blocks(n), kThreads, s, g, l, dy, argmax,
               static_cast<float*>(dx));
  }
}
void AvgPoolForward(const PoolGeom& g, const PoolLayout& l, const float* x, float* y,
                    cudaStream_t s) {
  const int64_t n = g.planes * g.p * g.q;
  if (n > 0) DPT_LAUNCH(AvgPoolForwardKernel, Blocks(n), kThreads, s, g, l, x, y);
}
void AvgPoolBackward(const PoolGeom& g, const PoolLayout& l, const float* dy, float* dx,
                     cudaStream_t s) {
  const int64_t n = g.planes * g.h * g.w;
  if (n > 0) DPT_LAUNCH(AvgPoolBackwardKernel, Blocks(n), kThreads, s, g, l, dy, dx);
}

void BatchNormTraining(int64_t n, int64_t c, int64_t hw, double momentum, double eps, bool relu,
                       const float* x, const float* gamma, const float* beta, float* running_mean,
                       float* running_var, float* y, float* save_mean, float* save_invstd,
                       double* scratch, cudaStream_t s) {
  if (c == 0 || n * hw == 0) return;
  const int64_t parts = BatchNormParts(n, c, hw);
  double* sums = scratch;
  double* sqs = scratch + c * parts;
  const dim3 grid(static_cast<unsigned>(c), static_cast<unsigned>(parts));
  DPT_LAUNCH(BnStatsKernel, grid, kBnThreads, s, n, c, hw, parts, x, nullptr, sums);
  DPT_LAUNCH(BnStatsKernel, grid, kBnThreads, s, n, c, hw, parts, x, sums, sqs);
  DPT_LAUNCH(BnApplyKernel, grid, kBnThreads, s, n, c, hw, parts, momentum, eps, relu, x, gamma,
             beta, sums, sqs, running_mean, running_var, y, save_mean, save_invstd);
}
void BatchNormInference(int64_t n, int64_t c, int64_t hw, double eps, bool relu, const float* x,
                        const float* gamma, const float* beta, const float* running_mean,
                        const float* running_var, float* y, cudaStream_t s) {
  const int64_t m = n * hw;
  if (c == 0 || m == 0) return;
  const dim3 grid(static_cast<unsigned>(c), static_cast<unsigned>(std::clamp<int64_t>(
                                                (m + kThreads - 1) / kThreads, 1, 1024)));
  DPT_LAUNCH(BatchNormInferenceKernel, grid, kThreads, s, n, c, hw, eps, relu, x, gamma, beta,
             running_mean, running_var, y);
}
void BatchNormBackward(int64_t n, int64_t c, int64_t hw, const float* x, const float* dy,
                       const float* relu_y, const float* gamma, const float* save_mean,
                       const float* save_invstd, float* dx, float* dgamma, float* dbeta,
                       bool accumulate, double* scratch, cudaStream_t s) {
  if (c == 0 || n * hw == 0) return;
  const int64_t parts = BatchNormParts(n, c, hw);
  double* s_dy = scratch;
  double* s_dy_xc = scratch + c * parts;
  const dim3 grid(static_cast<unsigned>(c), static_cast<unsigned>(parts));
  DPT_LAUNCH(BnBackwardSumsKernel, grid, kBnThreads, s, n, c, hw, parts, x, dy, relu_y, save_mean,
             s_dy, s_dy_xc);
  DPT_LAUNCH(BnBackwardApplyKernel, grid, kBnThreads, s, n, c, hw, parts, x, dy, relu_y, gamma,
             save_mean, save_invstd, s_dy, s_dy_xc, dx, dgamma, dbeta, accumulate);
}

// Calls f(T{}) with T float or uint16_t (bf16): the element types of the channels-last batch norm.
template <class F>
void WithF32OrBf16(Elem e, F&& f) {
  DPT_CHECK(e != Elem::kF16) << "channels-last batch norm: f32 or bf16 tensors only";
  if (e == Elem::kBF16) {
    f(uint16_t{});
  } else {
    f(float{});
  }
}

dim3 BnNhwcGrid(int64_t c, int64_t parts) {
  return dim3(static_cast<unsigned>((c + kBnTileC - 1) / kBnTileC), static_cast<unsigned>(parts));
}

// The statistics pass and the fold: `affine` (2 x c) and the saved and running statistics.
template <class TX>
void BnNhwcStatistics(int64_t m, int64_t c, double momentum, double eps, const TX* x,
                      const float* gamma, const float* beta, float* running_mean,
                      float* running_var, float* affine, float* save_mean, float* save_invstd,
                      double* scratch, cudaStream_t s) {
  const int64_t parts = BatchNormNhwcParts(m, c);
  double* s1 = scratch;
  double* s2 = scratch + c * parts;
  const dim3 grid = BnNhwcGrid(c, parts), block(kBnTileC, kBnTileRows);
  const auto stats = BnNhwcStatsKernel<TX>;
  DPT_LAUNCH(stats, grid, block, s, m, c, parts, x, s1, s2);
  const auto fold = BnNhwcFoldKernel<TX>;
  DPT_LAUNCH(fold, Blocks(c), kThreads, s, m, c, parts, momentum, eps, x, gamma, beta, s1, s2,
             running_mean, running_var, affine, save_mean, save_invstd);
}

// The per-channel terms after the partial sums in the scratch (BatchNormNhwcScratch).
float* BnNhwcTerms(double* scratch, int64_t m, int64_t c) {
  return reinterpret_cast<float*>(scratch + 2 * c * BatchNormNhwcParts(m, c));
}

void BatchNormTrainingNhwc(int64_t m, int64_t c, double momentum, double eps, bool relu,
                           const void* x, Elem xt, const float* gamma, const float* beta,
                           float* running_mean, float* running_var, void* y, Elem yt,
                           float* save_mean, float* save_invstd, double* scratch, cudaStream_t s) {
  if (c == 0 || m == 0) return;
  const int64_t parts = BatchNormNhwcParts(m, c);
  float* affine = BnNhwcTerms(scratch, m, c);
  const dim3 grid = BnNhwcGrid(c, parts), block(kBnTileC, kBnTileRows);
  WithF32OrBf16(xt, [&](auto tx) {
    using TX = decltype(tx);
    const TX* xp = static_cast<const TX*>(x);
    BnNhwcStatistics(m, c, momentum, eps, xp, gamma, beta, running_mean, running_var, affine,
                     save_mean, save_invstd, scratch, s);
    WithF32OrBf16(yt, [&](auto ty) {
      using TY = decltype(ty);
      const auto apply = BnNhwcApplyKernel<TX, TY>;
      DPT_LAUNCH(apply, grid, block, s, m, c, parts, relu, xp, affine, static_cast<TY*>(y));
    });
  });
}

void BatchNormInferenceNhwc(int64_t m, int64_t c, double eps, bool relu, const void* x, Elem xt,
                            const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, void* y, Elem yt, double* scratch,
                            cudaStream_t s) {
  if (c == 0 || m == 0) return;
  const int64_t parts = BatchNormNhwcParts(m, c);
  float* affine = BnNhwcTerms(scratch, m, c);
  DPT_LAUNCH(BnAffineInferenceKernel, Blocks(c), kThreads, s, c, eps, gamma, beta, running_mean,
             running_var, affine);
  const dim3 grid = BnNhwcGrid(c, parts), block(kBnTileC, kBnTileRows);
  WithF32OrBf16(xt, [&](auto tx) {
    WithF32OrBf16(yt, [&](auto ty) {
      using TX = decltype(tx);
      using TY = decltype(ty);
      const auto apply = BnNhwcApplyKernel<TX, TY>;
      DPT_LAUNCH(apply, grid, block, s, m, c, parts, relu, static_cast<const TX*>(x), affine,
                 static_cast<TY*>(y));
    });
  });
}

void BatchNormBackwardNhwc(int64_t m, int64_t c, const void* x, Elem xt, const float* dy,
                           const float* dy2, const void* relu_y, Elem gt, const float* gamma,
                           const float* save_mean, const float* save_invstd, void* dx, Elem dxt,
                           float* dgamma, float* dbeta, bool accumulate, double* scratch,
                           cudaStream_t s) {
  if (c == 0 || m == 0) return;
  const int64_t parts = BatchNormNhwcParts(m, c);
  double* s_dy = scratch;
  double* s_dy_xc = scratch + c * parts;
  float* terms = BnNhwcTerms(scratch, m, c);
  const dim3 grid = BnNhwcGrid(c, parts), block(kBnTileC, kBnTileRows);
  WithF32OrBf16(xt, [&](auto tx) {
    WithF32OrBf16(gt, [&](auto tg) {
      using TX = decltype(tx);
      using TG = decltype(tg);
      const TX* xp = static_cast<const TX*>(x);
      const TG* gp = static_cast<const TG*>(relu_y);
      const auto sums = BnNhwcBackwardSumsKernel<TX, TG>;
      DPT_LAUNCH(sums, grid, block, s, m, c, parts, xp, dy, dy2, gp, save_mean, s_dy, s_dy_xc);
      DPT_LAUNCH(BnNhwcBackwardFoldKernel, Blocks(c), kThreads, s, m, c, parts, gamma, save_invstd,
                 s_dy, s_dy_xc, terms, dgamma, dbeta, accumulate);
      WithF32OrBf16(dxt, [&](auto td) {
        using TD = decltype(td);
        const auto apply = BnNhwcBackwardApplyKernel<TX, TG, TD>;
        DPT_LAUNCH(apply, grid, block, s, m, c, parts, xp, dy, dy2, gp, save_mean, terms,
                   static_cast<TD*>(dx));
      });
    });
  });
}

void BatchNormAffineTrainingNhwc(int64_t m, int64_t c, double momentum, double eps, const void* x,
                                 Elem xt, const float* gamma, const float* beta,
                                 float* running_mean, float* running_var, float* affine,
                                 float* save_mean, float* save_invstd, double* scratch,
                                 cudaStream_t s) {
  if (c == 0 || m == 0) return;
  WithF32OrBf16(xt, [&](auto tx) {
    using TX = decltype(tx);
    BnNhwcStatistics(m, c, momentum, eps, static_cast<const TX*>(x), gamma, beta, running_mean,
                     running_var, affine, save_mean, save_invstd, scratch, s);
  });
}

void BatchNormAffineInference(int64_t c, double eps, const float* gamma, const float* beta,
                              const float* running_mean, const float* running_var, float* affine,
                              cudaStream_t s) {
  if (c > 0) {
    DPT_LAUNCH(BnAffineInferenceKernel, Blocks(c), kThreads, s, c, eps, gamma, beta, running_mean,
               running_var, affine);
  }
}

void AffineAdd(const void* x0, Elem x0t, const float* affine0, const void* x1, Elem x1t,
               const float* affine1, bool relu, void* y, Elem yt, int64_t c, int64_t total,
               cudaStream_t s) {
  if (total == 0) return;
  WithF32OrBf16(x0t, [&](auto t0) {
    WithF32OrBf16(x1t, [&](auto t1) {
      WithF32OrBf16(yt, [&](auto ty) {
        using X0 = decltype(t0);
        using X1 = decltype(t1);
        using Y = decltype(ty);
        const auto add = AffineAddKernel<X0, X1, Y>;
        DPT_LAUNCH(add, Blocks(total), kThreads, s, static_cast<const X0*>(x0), affine0,
                   static_cast<const X1*>(x1), affine1, relu, static_cast<Y*>(y), c, total);
      });
    });
  });
}

void ReluBackwardTyped(const void* y, Elem yt, const float* dy, const float* dy2, float* dx,
                       int64_t n, cudaStream_t s) {
  if (n == 0) return;
  WithF32OrBf16(yt, [&](auto ty) {
    using Y = decltype(ty);
    const auto relu_backward = ReluBackwardTypedKernel<Y>;
    DPT_LAUNCH(relu_backward, Blocks(n), kThreads, s, static_cast<const Y*>(y), dy, dy2, dx, n);
  });
}

void SoftmaxXent(int64_t n, int64_t k, const float* logits, const int32_t* labels, float eps,
                 float* probs, double* row_loss, int32_t* row_hit, unsigned long long* bad_label,
                 cudaStream_t s) {
  if (n == 0 || k == 0) return;
  const auto blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  DPT_LAUNCH(SoftmaxXentKernel, blocks, kThreads, s, n, k, logits, labels, eps, probs, row_loss,
             row_hit, bad_label);
}
void SumRows(int64_t n, const double* row_loss, const int32_t* row_hit, float* loss_sum,
             float* correct, cudaStream_t s) {
  DPT_LAUNCH(SumRowsKernel, 1, kThreads, s, n, row_loss, row_hit, loss_sum, correct);
}
void SoftmaxXentBackward(int64_t n, int64_t k, const float* probs, const int32_t* labels, float eps,
                         float scale, float* dlogits, cudaStream_t s) {
  if (n * k > 0) {
    DPT_LAUNCH(SoftmaxXentBackwardKernel, Blocks(n * k), kThreads, s, n, k, probs, labels, eps,
               scale, dlogits);
  }
}
void MseBackward(const float* y, const float* t, float scale, float* dy, int64_t n,
                 cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(MseBackwardKernel, Blocks(n), kThreads, s, y, t, scale, dy, n);
}

void SgdStep(const ew::SgdHyper& h, float* param, const float* grad, float* momentum, int64_t n,
             cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(SgdKernel, Blocks(n), kThreads, s, h, param, grad, momentum, n);
}
void AdamWStep(const ew::AdamWHyper& h, float* param, const float* grad, float* m, float* v,
               int64_t n, cudaStream_t s) {
  if (n > 0) DPT_LAUNCH(AdamWKernel, Blocks(n), kThreads, s, h, param, grad, m, v, n);
}

int ReductionPartials() { return kMaxPartials; }

void SumSquares(const float* x, int64_t n, double* partials, double* out, cudaStream_t s) {
  Reduce<double, double>(SquareOp{x}, n, partials, out, s);
}
void SquaredErrorSum(const float* y, const float* t, int64_t n, double* partials, float* out,
                     cudaStream_t s) {
  Reduce<double, float>(SquaredErrorOp{y, t}, n, partials, out, s);
}
void CountNonFinite(const float* x, int64_t n, unsigned long long* partials,
                    unsigned long long* out, cudaStream_t s) {
  Reduce<unsigned long long, unsigned long long>(NonFiniteOp{x}, n, partials, out, s);
}

}  // namespace dptrain::cuda::kernels
