// SPDX-License-Identifier: Apache-2.0
// CPU backend: the flat OpenMP loops over core/elementwise.h: ReLU, add, scale, dropout, the
// optimizer updates (SGD, AdamW) and the checks (non-finite count, sum of squares).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_backend_impl.h"
#include "core/elementwise.h"
#include "core/error.h"

namespace dptrain::cpu {

namespace {

// The flat loops run on blocks of the tensor, each block in a loop compiled for the machine's
// widest vectors (DPT_SIMD_CLONES): 3-4x the x86-64 baseline's 4-wide SSE where the data is in
// cache (the optimizer's flat buffers, most activations of a small batch). Arguments come by
// value, so the compiler knows no store aliases them. Every element's arithmetic is the same
// expression in every build (no contraction), so results do not depend on the vector width or
// the thread count.
constexpr int64_t kBlock = 1 << 13;
int64_t Blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
int64_t BlockEnd(int64_t n, int64_t k) { return std::min(n, (k + 1) * kBlock); }
template <class F>
void ForBlocks(int64_t n, F f) {
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t k = 0; k < Blocks(n); ++k) f(k * kBlock, BlockEnd(n, k));
}

DPT_SIMD_CLONES void ReluLoop(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = ew::Relu(x[i]);
}

DPT_SIMD_CLONES void ReluGradLoop(const float* y, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = ew::ReluGrad(y[i], dy[i]);
}

// ReluGradLoop of the gradient a + b (summed as AddLoop does).
DPT_SIMD_CLONES void ReluGradSumLoop(const float* y, const float* a, const float* b, float* dx,
                                     int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = ew::ReluGrad(y[i], a[i] + b[i]);
}

// The same gated by a bf16 y (Backend::WritesBf16Sums): its sign and zeros are the f32 y's, but
// for an f32 y below 2^-133 that rounds to 0. b null: one part.
DPT_SIMD_CLONES void ReluGradLoop(const uint16_t* y, const float* a, const float* b, float* dx,
                                  int64_t n) {
  if (b == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = ew::ReluGrad(ew::Bf16ToFloat(y[i]), a[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = ew::ReluGrad(ew::Bf16ToFloat(y[i]), a[i] + b[i]);
  }
}

DPT_CLONE_INLINE float GateValue(float y) { return y; }
DPT_CLONE_INLINE float GateValue(uint16_t y) { return ew::Bf16ToFloat(y); }

// One channels-last image row (w pixels of c channels) of ReluBackwardSum with b sampled at
// stride s (Conv2dDesc::dx_sub): b holds the row's every s-th pixel, or is null for a row between
// sampled ones. Where b holds nothing, a is added to 0, as to the zeros of the whole gradient.
template <class Y>
DPT_CLONE_INLINE void ReluGradSampledRowBody(const Y* y, const float* a, const float* b, float* dx,
                                             int64_t w, int64_t c, int64_t s) {
  if (b == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < w * c; ++i) dx[i] = ew::ReluGrad(GateValue(y[i]), a[i] + 0.f);
    return;
  }
  for (int64_t p = 0; p < w; ++p, y += c, a += c, dx += c) {
    if (p % s == 0) {
      const float* bp = b + p / s * c;
#pragma omp simd
      for (int64_t i = 0; i < c; ++i) dx[i] = ew::ReluGrad(GateValue(y[i]), a[i] + bp[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < c; ++i) dx[i] = ew::ReluGrad(GateValue(y[i]), a[i] + 0.f);
    }
  }
}
DPT_SIMD_CLONES void ReluGradSampledRow(const float* y, const float* a, const float* b, float* dx,
                                        int64_t w, int64_t c, int64_t s) {
  ReluGradSampledRowBody(y, a, b, dx, w, c, s);
}
DPT_SIMD_CLONES void ReluGradSampledRow(const uint16_t* y, const float* a, const float* b,
                                        float* dx, int64_t w, int64_t c, int64_t s) {
  ReluGradSampledRowBody(y, a, b, dx, w, c, s);
}

// ReluBackwardSum of channels-last y and a with b sampled at stride s: row by image row.
void ReluGradSampled(const Tensor& y, const Tensor& a, const Tensor& b, int64_t s, Tensor* dx) {
  const Shape& sh = y.shape();
  DPT_CHECK(sh.rank() == 4 && s > 1 && sh[2] % s == 0 && sh[3] % s == 0)
      << "relu backward with a part sampled at stride " << s << ": y " << sh.ToString();
  const int64_t n = sh[0], c = sh[1], h = sh[2], w = sh[3];
  DPT_CHECK(b.dtype() == DType::kF32 && (b.shape() == Shape{n, c, h / s, w / s}))
      << "relu backward: a part sampled at stride " << s << " of " << sh.ToString() << " is "
      << b.shape().ToString();
  DPT_CHECK(a.dtype() == DType::kF32 && dx->dtype() == DType::kF32 &&
            (y.dtype() == DType::kF32 || dx->raw() != y.raw()))
      << "relu backward: f32 gradients, dx apart from a bf16 y";
  const bool y16 = y.dtype() == DType::kBF16;
  const float* ga = a.data<float>();
  const float* gb = b.data<float>();
  float* out = dx->data<float>();
#pragma omp parallel for if (y.numel() > kParallelMin)
  for (int64_t r = 0; r < n * h; ++r) {
    const int64_t row = r % h, at = r * w * c;
    const float* br = row % s == 0 ? gb + ((r / h) * (h / s) + row / s) * (w / s) * c : nullptr;
    if (y16) {
      ReluGradSampledRow(static_cast<const uint16_t*>(y.raw()) + at, ga + at, br, out + at, w, c,
                         s);
    } else {
      ReluGradSampledRow(y.data<float>() + at, ga + at, br, out + at, w, c, s);
    }
  }
}

// y = a + b, or max(a + b, 0) when relu.
DPT_SIMD_CLONES void AddLoop(const float* a, const float* b, float* y, int64_t n, bool relu) {
  if (relu) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = ew::Relu(a[i] + b[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  }
}

// ReluBackward (b null) or ReluBackwardSum of a bf16 y: dx in f32, not over y.
void ReluGradBf16(const Tensor& y, const Tensor& a, const Tensor* b, Tensor* dx) {
  CheckSame(y, *dx, "relu backward");
  DPT_CHECK(dx->dtype() == DType::kF32 && dx->raw() != y.raw())
      << "relu backward of a bf16 y: dx in f32, apart from y";
  const auto* yy = static_cast<const uint16_t*>(y.raw());
  const float* ga = a.data<float>();
  const float* gb = b != nullptr ? b->data<float>() : nullptr;
  float* out = dx->data<float>();
  ForBlocks(y.numel(), [&](int64_t lo, int64_t hi) {
    ReluGradLoop(yy + lo, ga + lo, gb != nullptr ? gb + lo : nullptr, out + lo, hi - lo);
  });
}

}  // namespace

// ---- elementwise -------------------------------------------------------------------------

void CpuBackend::ReluForward(const Tensor& x, Tensor* y) {
  OpScope scope(this, "relu_fwd");
  CheckSame(x, *y, "relu");
  const float* in = x.data<float>();
  float* out = y->data<float>();
  ForBlocks(x.numel(), [&](int64_t b, int64_t e) { ReluLoop(in + b, out + b, e - b); });
}

void CpuBackend::ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) {
  OpScope scope(this, "relu_bwd");
  CheckSame(y, dy, "relu backward");
  if (y.dtype() == DType::kBF16) return ReluGradBf16(y, dy, nullptr, dx);
  const float* yy = y.data<float>();
  const float* g = dy.data<float>();
  float* out = dx->data<float>();
  ForBlocks(y.numel(), [&](int64_t b, int64_t e) { ReluGradLoop(yy + b, g + b, out + b, e - b); });
}

void CpuBackend::ReluBackwardSum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b,
                                 int64_t b_stride, Tensor* dx) {
  OpScope scope(this, "relu_bwd");
  CheckSame(y, dy_a, "relu backward");
  CheckSame(y, *dx, "relu backward");
  if (b_stride != 1) return ReluGradSampled(y, dy_a, dy_b, b_stride, dx);
  CheckSame(y, dy_b, "relu backward");
  if (y.dtype() == DType::kBF16) return ReluGradBf16(y, dy_a, &dy_b, dx);
  const float* yy = y.data<float>();
  const float* ga = dy_a.data<float>();
  const float* gb = dy_b.data<float>();
  float* out = dx->data<float>();
  ForBlocks(y.numel(),
            [&](int64_t b, int64_t e) { ReluGradSumLoop(yy + b, ga + b, gb + b, out + b, e - b); });
}

void CpuBackend::ActivationForward(const ew::Activation& f, const Tensor& x, Tensor* y) {
  OpScope scope(this, "activation_fwd");
  CheckSame(x, *y, "activation");
  const float* in = x.data<float>();
  float* out = y->data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = ew::Activate(f, in[i]);
}

void CpuBackend::ActivationBackward(const ew::Activation& f, const Tensor& x, const Tensor& y,
                                    const Tensor& dy, Tensor* dx) {
  OpScope scope(this, "activation_bwd");
  CheckSame(x, y, "activation backward");
  CheckSame(x, dy, "activation backward");
  CheckSame(x, *dx, "activation backward");
  const float* xx = x.data<float>();
  const float* yy = y.data<float>();
  const float* g = dy.data<float>();
  float* out = dx->data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = ew::ActivateGrad(f, xx[i], yy[i], g[i]);
}

namespace {
// Add and AddRelu.
void AddOp(const Tensor& a, const Tensor& b, Tensor* y, bool relu, const char* what) {
  CheckSame(a, b, what);
  CheckSame(a, *y, what);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* out = y->data<float>();
  ForBlocks(a.numel(),
            [&](int64_t s, int64_t e) { AddLoop(pa + s, pb + s, out + s, e - s, relu); });
}
}  // namespace

void CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor* y) {
  OpScope scope(this, "add");
  AddOp(a, b, y, false, "add");
}

void CpuBackend::AddRelu(const Tensor& a, const Tensor& b, Tensor* y) {
  OpScope scope(this, "add_relu");
  AddOp(a, b, y, true, "add_relu");
}

void CpuBackend::MulRows(const Tensor& x, const Tensor& s, Tensor* y) {
  OpScope scope(this, "mul_rows");
  CheckSame(x, *y, "mul_rows");
  const int64_t n = x.numel(), cols = RowLength(n, s.numel(), "mul_rows");
  const float* in = x.data<float>();
  const float* sc = s.data<float>();
  float* out = y->data<float>();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * sc[i / cols];
}

void CpuBackend::AddRows(const Tensor& x, const Tensor& s, Tensor* y) {
  OpScope scope(this, "add_rows");
  CheckSame(x, *y, "add_rows");
  const int64_t n = x.numel(), cols = RowLength(n, s.numel(), "add_rows");
  const float* in = x.data<float>();
  const float* sc = s.data<float>();
  float* out = y->data<float>();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] + sc[i / cols];
}

namespace {

// ds[r] = sum_j dy[r, j] * x[r, j] (x = nullptr: a plain sum), in double: one rounding per row,
// as the batch-norm sums.
void RowSums(const float* dy, const float* x, int64_t rows, int64_t cols, float* ds) {
#pragma omp parallel for if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t j = 0; j < cols; ++j) {
      acc += static_cast<double>(dy[r * cols + j]) * (x != nullptr ? x[r * cols + j] : 1.f);
    }
    ds[r] = static_cast<float>(acc);
  }
}

}  // namespace

void CpuBackend::RowDot(const Tensor& dy, const Tensor& x, Tensor* ds) {
  OpScope scope(this, "row_dot");
  CheckSame(dy, x, "row_dot");
  const int64_t rows = ds->numel();
  RowSums(dy.data<float>(), x.data<float>(), rows, RowLength(x.numel(), rows, "row_dot"),
          ds->data<float>());
}

void CpuBackend::RowSum(const Tensor& dy, Tensor* ds) {
  OpScope scope(this, "row_sum");
  const int64_t rows = ds->numel();
  RowSums(dy.data<float>(), nullptr, rows, RowLength(dy.numel(), rows, "row_sum"),
          ds->data<float>());
}

void CpuBackend::Pad2d(const Tensor& x, int64_t top, int64_t left, Tensor* y) {
  OpScope scope(this, "pad2d");
  const PadDims d = CheckPad2d(x, *y);
  const float* in = x.data<float>();
  float* out = y->data<float>();
  const int64_t n = d.planes * d.out_h * d.out_w;
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t e = 0; e < n; ++e) {
    const int64_t plane = e / (d.out_h * d.out_w), pos = e % (d.out_h * d.out_w);
    out[e] =
        ew::ShiftedAt(in + plane * d.h * d.w, d.h, d.w, top, left, pos / d.out_w, pos % d.out_w);
  }
}

namespace {

// Rows [r0, r0 + 16) of one (rows x cols) row-major matrix x into y, its transpose (cols x rows):
// whole tiles through registers, the edges element by element.
DPT_SIMD_CLONES void TransposeBand(const float* x, float* y, int64_t rows, int64_t cols,
                                   int64_t r0) {
  const int64_t r1 = std::min(rows, r0 + kTile);
  for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
    const int64_t c1 = std::min(cols, c0 + kTile);
    if (r1 - r0 < kTile || c1 - c0 < kTile) {
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r) y[c * rows + r] = x[r * cols + c];
      }
      continue;
    }
    TileRow t[kTile];
    for (int64_t i = 0; i < kTile; ++i)
      std::memcpy(&t[i], x + (r0 + i) * cols + c0, sizeof(TileRow));
    TransposeTile(t);
    for (int64_t i = 0; i < kTile; ++i)
      std::memcpy(y + (c0 + i) * rows + r0, &t[i], sizeof(TileRow));
  }
}

// y = each of x's `batch` (rows x cols) row-major matrices transposed, a band of 16 rows at a time
// (a band of each side stays in the L1 cache).
void TransposeBatch(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) {
  const int64_t bands = (rows + kTile - 1) / kTile;
#pragma omp parallel for if (batch * rows * cols > kParallelMin)
  for (int64_t t = 0; t < batch * bands; ++t) {
    const int64_t b = t / bands;
    TransposeBand(x + b * rows * cols, y + b * rows * cols, rows, cols, t % bands * kTile);
  }
}

}  // namespace

void CpuBackend::ToChannelsLast(const Tensor& x, Tensor* y) {
  OpScope scope(this, "to_channels_last");
  const LayoutDims d = CheckLayoutChange(x, *y, "to_channels_last");
  TransposeBatch(x.data<float>(), y->data<float>(), d.n, d.c, d.hw);
}

void CpuBackend::FromChannelsLast(const Tensor& x, Tensor* y) {
  OpScope scope(this, "from_channels_last");
  const LayoutDims d = CheckLayoutChange(x, *y, "from_channels_last");
  TransposeBatch(x.data<float>(), y->data<float>(), d.n, d.hw, d.c);
}

void CpuBackend::Scale(Tensor* t, float alpha) {
  OpScope scope(this, "scale");
  float* p = t->data<float>();
  const int64_t n = t->numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
}

void CpuBackend::DropoutForward(const Tensor& x, float p, uint64_t seed, Tensor* y) {
  OpScope scope(this, "dropout");
  CheckSame(x, *y, "dropout");
  const float* in = x.data<float>();
  float* out = y->data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = ew::Dropout(in[i], seed, static_cast<uint64_t>(i), p);
}

void CpuBackend::DropoutBackward(const Tensor& dy, float p, uint64_t seed, Tensor* dx) {
  DropoutForward(dy, p, seed, dx);  // the same mask and scale
}

// ---- optimizers --------------------------------------------------------------------------

namespace {

// The optimizer updates are bound by their arithmetic (SGD's five operations per element,
// AdamW's divide and square root) on a flat buffer that mostly stays in cache. One loop per
// configuration keeps the per-element branches of ew::SgdUpdate out of the loop.
DPT_SIMD_CLONES void SgdLoop(ew::SgdHyper h, float* p, const float* g, float* buf, int64_t n) {
  if (buf == nullptr) {
    h.momentum = 0.f;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      float unused = 0.f;
      ew::SgdUpdate(h, p + i, g[i], &unused);
    }
  } else if (h.nesterov) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) ew::SgdUpdate(h, p + i, g[i], buf + i);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) ew::SgdUpdate(h, p + i, g[i], buf + i);
  }
}

DPT_SIMD_CLONES void AdamWLoop(ew::AdamWHyper h, float* p, const float* g, float* m, float* v,
                               int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) ew::AdamWUpdate(h, p + i, g[i], m + i, v + i);
}

}  // namespace

void CpuBackend::SgdStep(const ew::SgdHyper& h, Tensor* param, const Tensor& grad,
                         Tensor* momentum) {
  OpScope scope(this, "sgd");
  CheckSame(*param, grad, "sgd");
  float* p = param->data<float>();
  const float* g = grad.data<float>();
  float* buf = momentum != nullptr && momentum->defined() ? momentum->data<float>() : nullptr;
  DPT_CHECK(buf != nullptr || h.momentum == 0.f) << "sgd with momentum needs a momentum buffer";
  ForBlocks(param->numel(), [&](int64_t b, int64_t e) {
    SgdLoop(h, p + b, g + b, buf != nullptr ? buf + b : nullptr, e - b);
  });
}

void CpuBackend::AdamWStep(const ew::AdamWHyper& h, Tensor* param, const Tensor& grad, Tensor* m,
                           Tensor* v) {
  OpScope scope(this, "adamw");
  CheckSame(*param, grad, "adamw");
  float* p = param->data<float>();
  const float* g = grad.data<float>();
  float* pm = m->data<float>();
  float* pv = v->data<float>();
  ForBlocks(param->numel(),
            [&](int64_t b, int64_t e) { AdamWLoop(h, p + b, g + b, pm + b, pv + b, e - b); });
}

// ---- checks ------------------------------------------------------------------------------

namespace {
DPT_SIMD_CLONES int64_t NonFiniteLoop(const float* p, int64_t n) {
  int64_t bad = 0;
#pragma omp simd reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) bad += ew::IsFinite(p[i]) ? 0 : 1;
  return bad;
}
}  // namespace

// Every step, over the whole gradient buffer (Trainer::CheckGradients).
int64_t CpuBackend::CountNonFinite(const Tensor& t) {
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) if (n > kParallelMin)
  for (int64_t k = 0; k < Blocks(n); ++k) {
    bad += NonFiniteLoop(p + k * kBlock, BlockEnd(n, k) - k * kBlock);
  }
  return bad;
}

double CpuBackend::SumSquares(const Tensor& t) {
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(p[i]) * p[i];
  return sum;
}

}  // namespace dptrain::cpu
