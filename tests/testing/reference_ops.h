// SPDX-License-Identifier: Apache-2.0
// Reference implementations of every op in core/backend.h: naive loops in double precision on
// std::vector<double> with explicit shapes. Obviously correct rather than fast; the conformance
// suites (tests/conformance/) compare each backend with these.
//
// Conventions (the same as backend.h):
//  - Dense row-major buffers: NCHW images, [N, F] features, conv weights OIHW (K, C, R, S),
//    linear weights [out, in]. Every buffer argument must have exactly the size the shape implies
//    (checked; a mismatch throws InternalError).
//  - Outputs are resized and overwritten, except weight gradients with `accumulate = true`,
//    which are added to (the output must then already have the right size).
//  - Nothing here calls the shared math in core/elementwise.h except the dropout mask
//    (ew::DropoutScale decides which elements are kept; the scaling itself is done in double),
//    so a slip in the shared math shows up as a conformance failure.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "core/elementwise.h"

namespace dptrain::ref {

using Vec = std::vector<double>;

// ---- conv2d: x (N,C,H,W), w (K,C,R,S), b (K) or nullptr, y (N,K,P,Q) with P = d.out_h(),
// Q = d.out_w(); zero padding `d.pad` on every side, stride `d.stride`. d.bias is ignored here:
// the bias is applied iff `b` is non-null. ----
void Conv2dForward(const Conv2dDesc& d, const Vec& x, const Vec& w, const Vec* b, Vec* y);
// dx (N,C,H,W) from dy (N,K,P,Q); input positions no window touches get 0.
void Conv2dBackwardData(const Conv2dDesc& d, const Vec& dy, const Vec& w, Vec* dx);
// dw (K,C,R,S) and db (K, may be nullptr) from x and dy.
void Conv2dBackwardWeights(const Conv2dDesc& d, const Vec& x, const Vec& dy, Vec* dw, Vec* db,
                           bool accumulate);

// ---- linear: x (n, in), w (out, in), b (out) or nullptr, y (n, out) = x w^T + b ----
void LinearForward(const LinearDesc& d, const Vec& x, const Vec& w, const Vec* b, Vec* y);
void LinearBackwardData(const LinearDesc& d, const Vec& dy, const Vec& w, Vec* dx);
void LinearBackwardWeights(const LinearDesc& d, const Vec& x, const Vec& dy, Vec* dw, Vec* db,
                           bool accumulate);

// ---- pooling: x (N,C,H,W), y (N,C,P,Q) ----
// Max: padding is -infinity. Avg: padded positions count as zeros and the divisor is always
// kernel*kernel (PyTorch count_include_pad=True; with floor-mode output sizes every window lies
// inside the padded image).
void PoolForward(const PoolDesc& d, const Vec& x, Vec* y);
// Max: each dy goes to the first maximum of its window in row-major window order (ties resolve to
// the lowest (row, col) offset); overlapping windows add. Avg: dy / (kernel*kernel) to every
// in-image position of the window. `x` is the forward input (only max pooling reads it).
void PoolBackward(const PoolDesc& d, const Vec& x, const Vec& dy, Vec* dx);

// ---- elementwise ----
void ReluForward(const Vec& x, Vec* y);
// dx = dy where y > 0, else 0 (y is the forward output).
void ReluBackward(const Vec& y, const Vec& dy, Vec* dx);
// The activations of ew::Activation, in double with PyTorch's definitions: clip to [a, b];
// sigmoid; hard sigmoid max(0, min(1, a x + b)); hard swish x * clamp(x + 3, 0, 6) / 6; tanh.
void ActivationForward(const ew::Activation& f, const Vec& x, Vec* y);
// From the forward input x and dy (PyTorch's gradients, zero at and beyond the kinks as there).
void ActivationBackward(const ew::Activation& f, const Vec& x, const Vec& dy, Vec* dx);
// One of each kind as PyTorch's modules define them (ReLU6, Sigmoid, Hardsigmoid, Hardswish,
// Tanh) plus an asymmetric clip, for the tests; `name` labels the case.
struct ActivationCase {
  const char* name;
  ew::Activation f;
};
std::vector<ActivationCase> ActivationCases();
void Add(const Vec& a, const Vec& b, Vec* y);
// x as (s.size(), cols): y[r, j] = x[r, j] * s[r]; ds[r] = sum_j dy[r, j] * x[r, j].
void MulRows(const Vec& x, const Vec& s, Vec* y);
void RowDot(const Vec& dy, const Vec& x, int64_t rows, Vec* ds);
// y[r, j] = x[r, j] + s[r]; its gradient for s is RowDot with x = 1.
void AddRows(const Vec& x, const Vec& s, Vec* y);
// x (planes, h, w) zero-padded (negative amounts: cropped) to (planes, h + top + bottom,
// w + left + right).
void Pad2d(const Vec& x, int64_t planes, int64_t h, int64_t w, int64_t top, int64_t left,
           int64_t bottom, int64_t right, Vec* y);
void Scale(Vec* t, double alpha);
// Inverted dropout: element i is kept iff ew::DropoutScale(seed, i, p) != 0 (the backends' shared
// stateless mask) and then multiplied by 1 / (1 - p) in double; dropped elements are 0.
void DropoutForward(const Vec& x, float p, uint64_t seed, Vec* y);
void DropoutBackward(const Vec& dy, float p, uint64_t seed, Vec* dx);

// ---- batch norm: x is (N, C, S) with S = H*W (S = 1 for (N, C) inputs); statistics per channel
// over M = N*S values. ----
struct BatchNormShape {
  int64_t n = 0, c = 0, spatial = 1;
  int64_t count() const { return n * spatial; }  // M: values per channel
};
// Normalises with the biased batch variance; save_mean = mean, save_invstd = 1/sqrt(var + eps);
// running_mean/var (C) are updated in place: running = (1 - m) * running + m * batch, with the
// unbiased variance var * M / (M - 1) for running_var (PyTorch). Requires M > 1.
void BatchNormForwardTraining(const BatchNormArgs& a, const BatchNormShape& s, const Vec& x,
                              const Vec& gamma, const Vec& beta, Vec* running_mean,
                              Vec* running_var, Vec* y, Vec* save_mean, Vec* save_invstd);
// y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta.
void BatchNormForwardInference(const BatchNormArgs& a, const BatchNormShape& s, const Vec& x,
                               const Vec& gamma, const Vec& beta, const Vec& running_mean,
                               const Vec& running_var, Vec* y);
// Gradients of the training forward with the saved statistics: xhat = (x - mean) * invstd,
// dbeta = sum dy, dgamma = sum dy * xhat, dx = gamma * invstd / M * (M dy - dbeta - xhat dgamma).
// dgamma and dbeta are added to when `accumulate`; dx is always overwritten.
void BatchNormBackward(const BatchNormShape& s, const Vec& x, const Vec& dy, const Vec& gamma,
                       const Vec& save_mean, const Vec& save_invstd, Vec* dx, Vec* dgamma,
                       Vec* dbeta, bool accumulate);

// ---- losses ----
// logits (n, k), labels in [0, k). probs = softmax(logits) (max-subtracted, so logits of 1e3 are
// fine); loss_sum = sum_i -log probs[i, label_i] computed as logsumexp - logit (no log(0));
// correct = number of rows whose argmax (ties -> lowest index) equals the label. With label
// smoothing eps the target distribution is q = (1 - eps) onehot + eps / k and the loss
// sum_j q_j * -log probs[i, j] (F.cross_entropy's label_smoothing, by its definition).
void SoftmaxCrossEntropy(int64_t n, int64_t k, const Vec& logits,
                         const std::vector<int32_t>& labels, Vec* probs, double* loss_sum,
                         int64_t* correct, double smoothing = 0);
// dlogits = (probs - q) * scale.
void SoftmaxCrossEntropyBackward(int64_t n, int64_t k, const Vec& probs,
                                 const std::vector<int32_t>& labels, double scale, Vec* dlogits,
                                 double smoothing = 0);
// sum((y - t)^2) and dy = 2 (y - t) * scale.
double MseLoss(const Vec& y, const Vec& t);
void MseBackward(const Vec& y, const Vec& t, double scale, Vec* dy);

// ---- optimizers (PyTorch semantics, every hyper-parameter read as double) ----
// g' = g * grad_scale + wd * p; if momentum != 0: buf = m * buf + g', g' = nesterov ? g' + m * buf
// : buf (buf untouched when momentum == 0); p -= lr * g'.
void SgdStep(const ew::SgdHyper& h, Vec* param, const Vec& grad, Vec* momentum);
// g' = g * grad_scale; p *= 1 - lr * wd; m = b1 m + (1 - b1) g'; v = b2 v + (1 - b2) g'^2;
// p -= lr * (m / bias_correction1) / (sqrt(v / bias_correction2) + eps).
void AdamWStep(const ew::AdamWHyper& h, Vec* param, const Vec& grad, Vec* m, Vec* v);

// ---- checks ----
int64_t CountNonFinite(const std::vector<float>& t);  // NaN, +Inf, -Inf
double SumSquares(const Vec& t);

}  // namespace dptrain::ref
