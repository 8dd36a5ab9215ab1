// SPDX-License-Identifier: Apache-2.0
// CUDA backend: batch norm (training, inference, backward) and the losses (softmax
// cross-entropy with its label check, MSE), with per-channel / per-row results reduced in a
// fixed order (deterministic).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_rules.h"
#include "core/cuda/kernels.h"
#include "core/error.h"

namespace dptrain::cuda {
namespace {

void CheckChannels(const Tensor& t, int64_t c, const char* what) {
  CheckF32(t, what);
  DPT_CHECK(t.numel() == c) << what << " " << t.shape().ToString() << " for " << c << " channels";
}

// The per-channel tensors of a training forward.
void CheckTrainingChannels(int64_t c, const Tensor& gamma, const Tensor& beta,
                           const Tensor& running_mean, const Tensor& running_var,
                           const Tensor& save_mean, const Tensor& save_invstd) {
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd}) {
    CheckChannels(*t, c, "batch norm per-channel tensor");
  }
}

}  // namespace

double* CudaBackend::BatchNormScratch(const BatchNormDims& d, bool nhwc) {
  const int64_t doubles =
      nhwc ? BatchNormNhwcScratch(d.n * d.hw, d.c) : 2 * d.c * BatchNormParts(d.n, d.c, d.hw);
  const int64_t bytes = doubles * static_cast<int64_t>(sizeof(double));
  // One stream: a replaced buffer's last reader runs before the allocator hands it out again.
  if (!bn_partials_.defined() || bn_partials_.numel() < bytes) {
    bn_partials_ = Empty(Shape{bytes}, DType::kU8, "batch norm partials");
  }
  return bn_partials_.data<double>();
}

// ---- batch norm ---------------------------------------------------------------------------------
// NCHW: f32 only, kernels::BatchNorm*; channels-last (a.nhwc): kernels::BatchNorm*Nhwc, with x, y
// and dx in bf16 where a.x_bf16, y_bf16 and dx_bf16 say (the 16-bit hand-offs with the bf16
// convolutions around it, decided by the graph passes).

bool CudaBackend::Supports(const BatchNormArgs& a) const {
  return a.nhwc || (!a.dx_bf16 && !a.y_bf16 && !a.x_bf16);
}

void CudaBackend::BatchNormForwardTraining(const BatchNormArgs& a, const Tensor& x,
                                           const Tensor& gamma, const Tensor& beta,
                                           Tensor* running_mean, Tensor* running_var, Tensor* y,
                                           Tensor* save_mean, Tensor* save_invstd) {
  OpScope scope(this, "batchnorm_fwd");
  DPT_CHECK(Supports(a)) << "cuda: 16-bit batch-norm tensors on NCHW activations";
  const kernels::Elem xt = ExpectElem(x, a.x_bf16, "batch norm x");
  const kernels::Elem yt = ExpectElem(*y, a.y_bf16, "batch norm y");
  CheckSame(x, *y, "batch norm");
  const BatchNormDims d = BatchNormShape(x.shape());
  CheckTrainingChannels(d.c, gamma, beta, *running_mean, *running_var, *save_mean, *save_invstd);
  if (a.nhwc) {
    kernels::BatchNormTrainingNhwc(
        d.n * d.hw, d.c, a.momentum, a.eps, a.relu, x.raw(), xt, gamma.data<float>(),
        beta.data<float>(), running_mean->data<float>(), running_var->data<float>(), y->raw(), yt,
        save_mean->data<float>(), save_invstd->data<float>(), BatchNormScratch(d, true), stream_);
    return;
  }
  kernels::BatchNormTraining(d.n, d.c, d.hw, a.momentum, a.eps, a.relu, x.data<float>(),
                             gamma.data<float>(), beta.data<float>(), running_mean->data<float>(),
                             running_var->data<float>(), y->data<float>(), save_mean->data<float>(),
                             save_invstd->data<float>(), BatchNormScratch(d, false), stream_);
}

void CudaBackend::BatchNormForwardInference(const BatchNormArgs& a, const Tensor& x,
                                            const Tensor& gamma, const Tensor& beta,
                                            const Tensor& running_mean, const Tensor& running_var,
                                            Tensor* y) {
  OpScope scope(this, "batchnorm_infer");
  DPT_CHECK(Supports(a)) << "cuda: 16-bit batch-norm tensors on NCHW activations";
  const kernels::Elem xt = ExpectElem(x, a.x_bf16, "batch norm x");
  const kernels::Elem yt = ExpectElem(*y, a.y_bf16, "batch norm y");
  CheckSame(x, *y, "batch norm");
  const BatchNormDims d = BatchNormShape(x.shape());
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var}) {
    CheckChannels(*t, d.c, "batch norm per-channel tensor");
  }
  if (a.nhwc) {
    kernels::BatchNormInferenceNhwc(d.n * d.hw, d.c, a.eps, a.relu, x.raw(), xt,
                                    gamma.data<float>(), beta.data<float>(),
                                    running_mean.data<float>(), running_var.data<float>(), y->raw(),
                                    yt, BatchNormScratch(d, true), stream_);
    return;
  }
  kernels::BatchNormInference(d.n, d.c, d.hw, a.eps, a.relu, x.data<float>(), gamma.data<float>(),
                              beta.data<float>(), running_mean.data<float>(),
                              running_var.data<float>(), y->data<float>(), stream_);
}

// beta is not read: the gate comes from relu_y (the kernels may contract the forward's
// x * scale + shift into one multiply-add, so recomputing it here need not give the same bits).
// relu_y is the forward's y: bf16 where the forward wrote it so (a.y_bf16).
void CudaBackend::BatchNormBackward(const BatchNormArgs& a, const Tensor& x, const Tensor& dy,
                                    const Tensor* relu_y, const Tensor& gamma,
                                    const Tensor& /*beta*/, const Tensor& save_mean,
                                    const Tensor& save_invstd, Tensor* dx, Tensor* dgamma,
                                    Tensor* dbeta, bool accumulate) {
  OpScope scope(this, "batchnorm_bwd");
  BatchNormGrad(a, x, dy, nullptr, relu_y, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
                accumulate);
}

// BatchNormBackward of dy_a + dy_b, channels-last: the parts are added as the kernels read them.
void CudaBackend::BatchNormBackwardSum(const BatchNormArgs& a, const Tensor& x, const Tensor& dy_a,
                                       const Tensor& dy_b, const Tensor* relu_y,
                                       const Tensor& gamma, const Tensor& /*beta*/,
                                       const Tensor& save_mean, const Tensor& save_invstd,
                                       Tensor* dx, Tensor* dgamma, Tensor* dbeta, bool accumulate) {
  OpScope scope(this, "batchnorm_bwd");
  DPT_CHECK(a.nhwc) << "cuda: a batch-norm gradient in two parts on NCHW activations";
  BatchNormGrad(a, x, dy_a, &dy_b, relu_y, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
                accumulate);
}

void CudaBackend::BatchNormGrad(const BatchNormArgs& a, const Tensor& x, const Tensor& dy,
                                const Tensor* dy2, const Tensor* relu_y, const Tensor& gamma,
                                const Tensor& save_mean, const Tensor& save_invstd, Tensor* dx,
                                Tensor* dgamma, Tensor* dbeta, bool accumulate) {
  DPT_CHECK(Supports(a)) << "cuda: 16-bit batch-norm tensors on NCHW activations";
  const kernels::Elem xt = ExpectElem(x, a.x_bf16, "batch norm x");
  const kernels::Elem dxt = ExpectElem(*dx, a.dx_bf16, "batch norm dx");
  for (const Tensor* g : {&dy, dy2}) {
    if (g == nullptr) continue;
    CheckF32(*g, "batch norm dy");
    CheckSame(x, *g, "batch norm backward");
  }
  CheckSame(x, *dx, "batch norm backward");
  kernels::Elem gt = kernels::Elem::kF32;
  if (relu_y != nullptr) {
    gt = ExpectElem(*relu_y, a.y_bf16, "batch norm relu output");
    CheckSame(x, *relu_y, "batch norm backward (relu output)");
  }
  const BatchNormDims d = BatchNormShape(x.shape());
  for (const Tensor* t : {&gamma, &save_mean, &save_invstd, static_cast<const Tensor*>(dgamma),
                          static_cast<const Tensor*>(dbeta)}) {
    CheckChannels(*t, d.c, "batch norm per-channel tensor");
  }
  if (a.nhwc) {
    kernels::BatchNormBackwardNhwc(
        d.n * d.hw, d.c, x.raw(), xt, dy.data<float>(),
        dy2 != nullptr ? dy2->data<float>() : nullptr, relu_y != nullptr ? relu_y->raw() : nullptr,
        gt, gamma.data<float>(), save_mean.data<float>(), save_invstd.data<float>(), dx->raw(), dxt,
        dgamma->data<float>(), dbeta->data<float>(), accumulate, BatchNormScratch(d, true),
        stream_);
    return;
  }
  DPT_CHECK(dy2 == nullptr) << "cuda: a batch-norm gradient in two parts on NCHW activations";
  kernels::BatchNormBackward(d.n, d.c, d.hw, x.data<float>(), dy.data<float>(),
                             relu_y != nullptr ? relu_y->data<float>() : nullptr,
                             gamma.data<float>(), save_mean.data<float>(),
                             save_invstd.data<float>(), dx->data<float>(), dgamma->data<float>(),
                             dbeta->data<float>(), accumulate, BatchNormScratch(d, false), stream_);
}

// ---- a batch norm applied by the sum that reads it; a gradient in two parts --------------------

namespace {

void CheckAffine(const Tensor& affine, int64_t c) {
  CheckF32(affine, "batch norm affine");
  DPT_CHECK(affine.numel() == 2 * c)
      << "batch norm affine " << affine.shape().ToString() << " for " << c << " channels";
}

}  // namespace

void CudaBackend::BatchNormAffineTraining(const BatchNormArgs& a, const Tensor& x,
                                          const Tensor& gamma, const Tensor& beta,
                                          Tensor* running_mean, Tensor* running_var, Tensor* affine,
                                          Tensor* save_mean, Tensor* save_invstd) {
  OpScope scope(this, "batchnorm_fwd");
  DPT_CHECK(a.nhwc && !a.relu && !a.y_bf16)
      << "cuda: a deferred batch norm is channels-last, without a folded ReLU or a bf16 output";
  const kernels::Elem xt = ExpectElem(x, a.x_bf16, "batch norm x");
  const BatchNormDims d = BatchNormShape(x.shape());
  CheckTrainingChannels(d.c, gamma, beta, *running_mean, *running_var, *save_mean, *save_invstd);
  CheckAffine(*affine, d.c);
  kernels::BatchNormAffineTrainingNhwc(
      d.n * d.hw, d.c, a.momentum, a.eps, x.raw(), xt, gamma.data<float>(), beta.data<float>(),
      running_mean->data<float>(), running_var->data<float>(), affine->data<float>(),
      save_mean->data<float>(), save_invstd->data<float>(), BatchNormScratch(d, true), stream_);
}

void CudaBackend::BatchNormAffineInference(const BatchNormArgs& a, const Tensor& gamma,
                                           const Tensor& beta, const Tensor& running_mean,
                                           const Tensor& running_var, Tensor* affine) {
  OpScope scope(this, "batchnorm_infer");
  const int64_t c = gamma.numel();
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var}) {
    CheckChannels(*t, c, "batch norm per-channel tensor");
  }
  CheckAffine(*affine, c);
  kernels::BatchNormAffineInference(c, a.eps, gamma.data<float>(), beta.data<float>(),
                                    running_mean.data<float>(), running_var.data<float>(),
                                    affine->data<float>(), stream_);
}

void CudaBackend::AffineAdd(const Tensor& x0, const Tensor* affine0, const Tensor& x1,
                            const Tensor* affine1, bool relu, Tensor* y) {
  OpScope scope(this, relu ? "bn_add_relu" : "bn_add");
  // x0 and x1: f32, or bf16 where that input's batch norm reads a bf16 x (BatchNormArgs::x_bf16).
  const auto elem = [](const Tensor& t, bool may_be_bf16, const char* what) {
    return may_be_bf16 ? F32OrBf16Elem(t, what) : ExpectElem(t, false, what);
  };
  const kernels::Elem t0 = elem(x0, affine0 != nullptr, "affine add x0");
  const kernels::Elem t1 = elem(x1, affine1 != nullptr, "affine add x1");
  const kernels::Elem ty = F32OrBf16Elem(*y, "affine add y");
  CheckSame(x0, x1, "affine add");
  CheckSame(x0, *y, "affine add");
  DPT_CHECK(y->raw() != x0.raw() && y->raw() != x1.raw()) << "affine add: y aliases an input";
  DPT_CHECK(x0.shape().rank() == 4) << "affine add of " << x0.shape().ToString();
  DPT_CHECK(affine0 != nullptr || affine1 != nullptr) << "affine add without an affine: Add";
  const int64_t c = x0.shape()[1];
  if (affine0 != nullptr) CheckAffine(*affine0, c);
  if (affine1 != nullptr) CheckAffine(*affine1, c);
  kernels::AffineAdd(x0.raw(), t0, affine0 != nullptr ? affine0->data<float>() : nullptr, x1.raw(),
                     t1, affine1 != nullptr ? affine1->data<float>() : nullptr, relu, y->raw(), ty,
                     c, x0.numel(), stream_);
}

// ---- losses -------------------------------------------------------------------------------------

void CudaBackend::SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels,
                                      float label_smoothing, Tensor* probs, Tensor* loss_sum,
                                      Tensor* correct) {
  OpScope scope(this, "softmax_xent");
  CheckF32(logits, "softmax logits");
  DPT_CHECK(logits.shape().rank() == 2) << "logits " << logits.shape().ToString();
  const int64_t n = logits.shape()[0], k = logits.shape()[1];
  CheckDev(labels, "softmax labels");
  DPT_CHECK(labels.numel() == n && labels.dtype() == DType::kI32) << "labels for " << n;
  DPT_CHECK(n < INT_MAX) << "batch of " << n << " rows";
  CheckF32(*probs, "softmax probs");
  CheckSame(logits, *probs, "softmax probs");
  CheckF32(*loss_sum, "softmax loss_sum");
  if (correct != nullptr) CheckF32(*correct, "softmax correct");
  // Per-row results, summed in a fixed order by a second kernel (deterministic). Temporaries
  // come from the caching allocator; stream order makes their reuse safe.
  Tensor row_loss = Empty(Shape{std::max<int64_t>(n, 1) * 8}, DType::kU8, "softmax row losses");
  Tensor row_hit = Empty(Shape{std::max<int64_t>(n, 1) * 4}, DType::kU8, "softmax row hits");
  // A label outside [0, k) is a data error, as on the CPU, found without stalling the stream: the
  // kernel records it in a sticky device code, copied here into pinned memory that the next
  // synchronising call reads (SyncStream), normally within the same training step.
  auto* bad_label = ScalarSlot<unsigned long long>(scalars_, kBadLabelSlot);
  kernels::SoftmaxXent(n, k, logits.data<float>(), labels.data<int32_t>(), label_smoothing,
                       probs->data<float>(), row_loss.data<double>(), row_hit.data<int32_t>(),
                       bad_label, stream_);
  kernels::SumRows(n, row_loss.data<double>(), row_hit.data<int32_t>(), loss_sum->data<float>(),
                   correct != nullptr ? correct->data<float>() : nullptr, stream_);
  bad_label_classes_ = k;
  DPT_CUDA_CHECK(cudaMemcpyAsync(bad_label_host_, bad_label, sizeof *bad_label_host_,
                                 cudaMemcpyDeviceToHost, stream_));
}

void CudaBackend::SoftmaxCrossEntropyBackward(const Tensor& probs, const Tensor& labels,
                                              float label_smoothing, float scale, Tensor* dlogits) {
  OpScope scope(this, "softmax_xent_bwd");
  CheckF32(probs, "softmax probs");
  DPT_CHECK(probs.shape().rank() == 2) << "probs " << probs.shape().ToString();
  const int64_t n = probs.shape()[0], k = probs.shape()[1];
  CheckDev(labels, "softmax labels");
  DPT_CHECK(labels.numel() == n && labels.dtype() == DType::kI32) << "labels for " << n;
  CheckF32(*dlogits, "softmax dlogits");
  CheckSame(probs, *dlogits, "softmax backward");
  kernels::SoftmaxXentBackward(n, k, probs.data<float>(), labels.data<int32_t>(), label_smoothing,
                               scale, dlogits->data<float>(), stream_);
}

void CudaBackend::MseLoss(const Tensor& y, const Tensor& t, Tensor* loss_sum) {
  OpScope scope(this, "mse");
  CheckF32(y, "mse y");
  CheckF32(t, "mse t");
  CheckF32(*loss_sum, "mse loss_sum");
  CheckSame(y, t, "mse");
  kernels::SquaredErrorSum(y.data<float>(), t.data<float>(), y.numel(), partials_.data<double>(),
                           loss_sum->data<float>(), stream_);
}

void CudaBackend::MseBackward(const Tensor& y, const Tensor& t, float scale, Tensor* dy) {
  OpScope scope(this, "mse_bwd");
  CheckF32(y, "mse y");
  CheckF32(t, "mse t");
  CheckF32(*dy, "mse dy");
  CheckSame(y, t, "mse backward");
  CheckSame(y, *dy, "mse backward");
  kernels::MseBackward(y.data<float>(), t.data<float>(), scale, dy->data<float>(), y.numel(),
                       stream_);
}

}  // namespace dptrain::cuda
