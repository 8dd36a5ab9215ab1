// SPDX-License-Identifier: Apache-2.0
// Launchers for dptrain's own CUDA kernels (kernels.cu): elementwise ops, casts, pooling, batch
// norm, losses, optimizer updates and deterministic reductions. Every elementwise body calls the
// shared __host__ __device__ math of core/elementwise.h, so the CPU tests exercise the same
// arithmetic. Each launcher enqueues on `stream`, checks the launch (DPT_CUDA_CHECK_LAUNCH) and
// does nothing for empty inputs. Pointers are device pointers; 16-bit buffers are passed as
// void* (bf16 / IEEE half bit patterns) so this header needs no CUDA half-precision headers.
//
// Reductions are deterministic: a fixed number of blocks (a function of the size only) each
// reduce a fixed strided subset, then one block reduces the partials in a fixed order, so the
// same input gives bit-identical results on every run and every rank.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/elementwise.h"
#include "core/pool_window.h"

namespace dptrain::cuda::kernels {

// ---- elementwise (f32) ----
void Fill(float* p, int64_t n, float value, cudaStream_t s);
void Relu(const float* x, float* y, int64_t n, cudaStream_t s);
void ReluBackward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t s);
void Activate(ew::Activation f, const float* x, float* y, int64_t n, cudaStream_t s);
void ActivateBackward(ew::Activation f, const float* x, const float* y, const float* dy, float* dx,
                      int64_t n, cudaStream_t s);
void Add(const float* a, const float* b, float* y, int64_t n, cudaStream_t s);  // y may alias
// y = max(a + b, 0); y may alias
void AddRelu(const float* a, const float* b, float* y, int64_t n, cudaStream_t s);
void Scale(float* p, int64_t n, float alpha, cudaStream_t s);
// y[r, j] = x[r, j] * sc[r] over (rows, cols); y may alias x.
void MulRows(const float* x, const float* sc, float* y, int64_t rows, int64_t cols, cudaStream_t s);
// ds[r] = sum_j dy[r, j] * x[r, j] (x = nullptr: sum_j dy[r, j]), one warp per row, summed in
// double in a fixed order.
void RowDot(const float* dy, const float* x, float* ds, int64_t rows, int64_t cols, cudaStream_t s);
// y[r, j] = x[r, j] + sc[r] over (rows, cols); y may alias x.
void AddRows(const float* x, const float* sc, float* y, int64_t rows, int64_t cols, cudaStream_t s);
// (planes) h x w into out_h x out_w, input (0, 0) at (top, left), zeros elsewhere (ew::ShiftedAt).
void Pad2d(const float* x, float* y, int64_t planes, int64_t h, int64_t w, int64_t out_h,
           int64_t out_w, int64_t top, int64_t left, cudaStream_t s);
void AddInto(const float* x, float* y, int64_t n, cudaStream_t s);  // y += x
void Dropout(const float* x, float* y, int64_t n, float p, uint64_t seed, cudaStream_t s);

// ---- casts: f32 <-> bf16 / f16 (round to nearest even); *ToF32 adds into y when accumulate ----
enum class Half : uint8_t { kBF16, kF16 };
void F32ToHalf(Half kind, const float* x, void* y, int64_t n, cudaStream_t s);
void HalfToF32(Half kind, const void* x, float* y, int64_t n, bool accumulate, cudaStream_t s);

// Element types of Convert and of the channels-last batch norm (bf16 and fp16 as bit patterns).
enum class Elem : uint8_t { kF32, kBF16, kF16 };
inline Elem ElemOf(Half h) { return h == Half::kBF16 ? Elem::kBF16 : Elem::kF16; }
// x (planes, c, hw) into y, each in its own element type and layout (channels-last: (planes, hw,
// c)), finishing a convolution's result on the way: v = widen(x) [+ b[channel]] (b nullable),
// max(v, 0) when relu, added to y's value when accumulate, rounded to y's type (to nearest even).
// The convolution's staging (16-bit operands, NHWC for tensor cores) and its epilogue. In place
// (x == y) only with equal types and layouts and without accumulate.
void Convert(const void* x, Elem xt, bool x_nhwc, void* y, Elem yt, bool y_nhwc, const float* b,
             bool relu, bool accumulate, int64_t planes, int64_t c, int64_t hw, cudaStream_t s);
// The same tiles in f32 (Backend::ToChannelsLast / FromChannelsLast): x (n, c, hw) into y
// (n, hw, c), and back. c at most 65535 * 32 (the tiles of c are the grid's y).
void ToChannelsLast(const float* x, float* y, int64_t n, int64_t c, int64_t hw, cudaStream_t s);
void FromChannelsLast(const float* x, float* y, int64_t n, int64_t c, int64_t hw, cudaStream_t s);

// ---- linear helpers: y (rows, cols) row-major ----
void AddBiasRows(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t s);
// db[j] (+)= sum_i dy[i, j], summed in double.
void ColumnSums(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate,
                cudaStream_t s);

// ---- pooling over (N*C) planes of H x W into P x Q ----
using ew::PoolGeom;  // core/pool_window.h: the window arithmetic shared with the CPU
// The layouts of x (and dx) and of y (and dy, argmax), each NCHW or channels-last, of c channels
// (planes = N * c).
struct PoolLayout {
  int64_t c = 1;
  bool x_nhwc = false, y_nhwc = false;
};
// argmax (nullable): int32 position ih * W + iw of each window's first maximum (row-major order),
// stored where y stores the window's output.
void MaxPoolForward(const PoolGeom& g, const PoolLayout& l, const float* x, float* y,
                    int32_t* argmax, cudaStream_t s);
// dx f32, or bf16 where dx_bf16 (windows that do not overlap: PoolDesc::dx_bf16).
void MaxPoolBackward(const PoolGeom& g, const PoolLayout& l, const float* dy, const int32_t* argmax,
                     void* dx, bool dx_bf16, cudaStream_t s);
// Average pooling with torch.nn.AvgPool2d's divisor (ew::WindowOf).
void AvgPoolForward(const PoolGeom& g, const PoolLayout& l, const float* x, float* y,
                    cudaStream_t s);
void AvgPoolBackward(const PoolGeom& g, const PoolLayout& l, const float* dy, float* dx,
                     cudaStream_t s);

// ---- batch norm over (N, HW) per channel of x (N, C, HW); statistics in double ----
// Training and backward need `scratch` of 2 * c * BatchNormParts(n, c, hw) doubles (cuda_rules.h).
// relu: y = max(batchnorm(x), 0); backward then gates dy by that y (relu_y, else nullptr), and dx
// may be relu_y.
void BatchNormTraining(int64_t n, int64_t c, int64_t hw, double momentum, double eps, bool relu,
                       const float* x, const float* gamma, const float* beta, float* running_mean,
                       float* running_var, float* y, float* save_mean, float* save_invstd,
                       double* scratch, cudaStream_t s);
void BatchNormInference(int64_t n, int64_t c, int64_t hw, double eps, bool relu, const float* x,
                        const float* gamma, const float* beta, const float* running_mean,
                        const float* running_var, float* y, cudaStream_t s);
void BatchNormBackward(int64_t n, int64_t c, int64_t hw, const float* x, const float* dy,
                       const float* relu_y, const float* gamma, const float* save_mean,
                       const float* save_invstd, float* dx, float* dgamma, float* dbeta,
                       bool accumulate, double* scratch, cudaStream_t s);

// ---- batch norm on channels-last x: (m = N * HW rows, c channels), per channel over the rows ----
// The same outputs and gradients as the NCHW kernels above (the same element math; the statistics
// in one pass, ew::BnShiftedMoments, reduced in another fixed order). x, y, relu_y and dx each f32
// or bf16 (Elem::kF16 is an InternalError); dy f32. Every call needs `scratch` of
// BatchNormNhwcScratch(m, c) doubles (cuda_rules.h). relu_y nullable (then gt is ignored); dx may
// be relu_y when both are f32.
void BatchNormTrainingNhwc(int64_t m, int64_t c, double momentum, double eps, bool relu,
                           const void* x, Elem xt, const float* gamma, const float* beta,
                           float* running_mean, float* running_var, void* y, Elem yt,
                           float* save_mean, float* save_invstd, double* scratch, cudaStream_t s);
void BatchNormInferenceNhwc(int64_t m, int64_t c, double eps, bool relu, const void* x, Elem xt,
                            const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, void* y, Elem yt, double* scratch,
                            cudaStream_t s);
// dy2 (nullable): the gradient's second part, added to dy in f32 as it is read
// (Backend::BatchNormBackwardSum).
void BatchNormBackwardNhwc(int64_t m, int64_t c, const void* x, Elem xt, const float* dy,
                           const float* dy2, const void* relu_y, Elem gt, const float* gamma,
                           const float* save_mean, const float* save_invstd, void* dx, Elem dxt,
                           float* dgamma, float* dbeta, bool accumulate, double* scratch,
                           cudaStream_t s);
// A batch norm applied by the sum that reads it (Backend::BatchNormAffineTraining, AffineAdd):
// the training statistics as BatchNormTrainingNhwc computes them, written as the per-channel
// scale and shift `affine` (2 x c f32) instead of an output; in inference from the running ones.
void BatchNormAffineTrainingNhwc(int64_t m, int64_t c, double momentum, double eps, const void* x,
                                 Elem xt, const float* gamma, const float* beta,
                                 float* running_mean, float* running_var, float* affine,
                                 float* save_mean, float* save_invstd, double* scratch,
                                 cudaStream_t s);
void BatchNormAffineInference(int64_t c, double eps, const float* gamma, const float* beta,
                              const float* running_mean, const float* running_var, float* affine,
                              cudaStream_t s);
// y = f0(x0) + f1(x1) (then ReLU) over channels-last (total / c, c), f_k applying affine_k
// (nullable: x_k itself); x0, x1 and y f32 or bf16. The same bits as the batch norms' apply
// kernels then Add / AddRelu.
void AffineAdd(const void* x0, Elem x0t, const float* affine0, const void* x1, Elem x1t,
               const float* affine1, bool relu, void* y, Elem yt, int64_t c, int64_t total,
               cudaStream_t s);
// dx = ReluGrad(y, dy [+ dy2]) with y f32 or bf16 (a bf16 residual sum), dy2 nullable.
void ReluBackwardTyped(const void* y, Elem yt, const float* dy, const float* dy2, float* dx,
                       int64_t n, cudaStream_t s);

// ---- losses ----
// Per row of logits (n, k): probs, row_loss (double), row_hit (0/1). A row whose label is
// outside [0, k) gets a NaN loss, and *bad_label becomes min(*bad_label, BadLabelCode(row,
// label)): sticky across calls until the caller resets it (to kNoBadLabel).
inline constexpr unsigned long long kNoBadLabel = ~0ull;
DPT_HD unsigned long long BadLabelCode(int64_t row, int32_t label) {
  return (static_cast<unsigned long long>(row) << 32) | static_cast<uint32_t>(label);
}
void SoftmaxXent(int64_t n, int64_t k, const float* logits, const int32_t* labels, float eps,
                 float* probs, double* row_loss, int32_t* row_hit, unsigned long long* bad_label,
                 cudaStream_t s);
// loss_sum[0] = sum(row_loss); correct[0] = sum(row_hit) when correct != nullptr.
void SumRows(int64_t n, const double* row_loss, const int32_t* row_hit, float* loss_sum,
             float* correct, cudaStream_t s);
void SoftmaxXentBackward(int64_t n, int64_t k, const float* probs, const int32_t* labels, float eps,
                         float scale, float* dlogits, cudaStream_t s);
void MseBackward(const float* y, const float* t, float scale, float* dy, int64_t n, cudaStream_t s);

// ---- optimizers (flat f32 buffers) ----
void SgdStep(const ew::SgdHyper& h, float* param, const float* grad, float* momentum, int64_t n,
             cudaStream_t s);  // momentum may be null when h.momentum == 0
void AdamWStep(const ew::AdamWHyper& h, float* param, const float* grad, float* m, float* v,
               int64_t n, cudaStream_t s);

// ---- deterministic reductions into device scalars ----
// `partials` must hold ReductionPartials() elements of the result type.
int ReductionPartials();
void SumSquares(const float* x, int64_t n, double* partials, double* out, cudaStream_t s);
void SquaredErrorSum(const float* y, const float* t, int64_t n, double* partials, float* out,
                     cudaStream_t s);
void CountNonFinite(const float* x, int64_t n, unsigned long long* partials,
                    unsigned long long* out, cudaStream_t s);

}  // namespace dptrain::cuda::kernels
