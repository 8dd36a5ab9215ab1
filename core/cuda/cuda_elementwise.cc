// SPDX-License-Identifier: Apache-2.0
// CUDA backend: the flat kernels over core/elementwise.h (ReLU, add, scale, dropout), the
// optimizer updates (SGD, AdamW) and the checks (non-finite count, sum of squares; these two
// synchronise to return their result).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels.h"
#include "core/elementwise.h"
#include "core/error.h"

namespace dptrain::cuda {

// ---- elementwise --------------------------------------------------------------------------------

void CudaBackend::ReluForward(const Tensor& x, Tensor* y) {
  OpScope scope(this, "relu_fwd");
  CheckF32(x, "relu x");
  CheckF32(*y, "relu y");
  CheckSame(x, *y, "relu");
  kernels::Relu(x.data<float>(), y->data<float>(), x.numel(), stream_);
}

void CudaBackend::ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) {
  OpScope scope(this, "relu_bwd");
  CheckF32(y, "relu y");
  CheckF32(dy, "relu dy");
  CheckF32(*dx, "relu dx");
  CheckSame(y, dy, "relu backward");
  CheckSame(y, *dx, "relu backward");
  kernels::ReluBackward(y.data<float>(), dy.data<float>(), dx->data<float>(), y.numel(), stream_);
}

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor* y) {
  OpScope scope(this, "add");
  CheckF32(a, "add a");
  CheckF32(b, "add b");
  CheckF32(*y, "add y");
  CheckSame(a, b, "add");
  CheckSame(a, *y, "add");
  kernels::Add(a.data<float>(), b.data<float>(), y->data<float>(), a.numel(), stream_);
}

void CudaBackend::Scale(Tensor* t, float alpha) {
  OpScope scope(this, "scale");
  CheckF32(*t, "scale");
  kernels::Scale(t->data<float>(), t->numel(), alpha, stream_);
}

void CudaBackend::DropoutForward(const Tensor& x, float p, uint64_t seed, Tensor* y) {
  OpScope scope(this, "dropout");
  CheckF32(x, "dropout x");
  CheckF32(*y, "dropout y");
  CheckSame(x, *y, "dropout");
  kernels::Dropout(x.data<float>(), y->data<float>(), x.numel(), p, seed, stream_);
}

void CudaBackend::DropoutBackward(const Tensor& dy, float p, uint64_t seed, Tensor* dx) {
  DropoutForward(dy, p, seed, dx);  // the same mask and scale
}

// ---- optimizers ---------------------------------------------------------------------------------

void CudaBackend::SgdStep(const ew::SgdHyper& h, Tensor* param, const Tensor& grad,
                          Tensor* momentum) {
  OpScope scope(this, "sgd");
  CheckF32(*param, "sgd param");
  CheckF32(grad, "sgd grad");
  CheckSame(*param, grad, "sgd");
  float* buf = nullptr;
  if (momentum != nullptr && momentum->defined()) {
    CheckF32(*momentum, "sgd momentum");
    CheckSame(*param, *momentum, "sgd momentum");
    buf = momentum->data<float>();
  }
  DPT_CHECK(buf != nullptr || h.momentum == 0.f) << "sgd with momentum needs a momentum buffer";
  kernels::SgdStep(h, param->data<float>(), grad.data<float>(), buf, param->numel(), stream_);
}

void CudaBackend::AdamWStep(const ew::AdamWHyper& h, Tensor* param, const Tensor& grad, Tensor* m,
                            Tensor* v) {
  OpScope scope(this, "adamw");
  CheckF32(*param, "adamw param");
  CheckF32(grad, "adamw grad");
  CheckF32(*m, "adamw m");
  CheckF32(*v, "adamw v");
  CheckSame(*param, grad, "adamw");
  CheckSame(*param, *m, "adamw m");
  CheckSame(*param, *v, "adamw v");
  kernels::AdamWStep(h, param->data<float>(), grad.data<float>(), m->data<float>(),
                     v->data<float>(), param->numel(), stream_);
}

// ---- checks (synchronise) -----------------------------------------------------------------------

int64_t CudaBackend::CountNonFinite(const Tensor& t) {
  MakeCurrent();
  CheckF32(t, "CountNonFinite");
  auto* out = ScalarSlot<unsigned long long>(scalars_, kCountSlot);
  kernels::CountNonFinite(t.data<float>(), t.numel(), partials_.data<unsigned long long>(), out,
                          stream_);
  unsigned long long host = 0;
  DPT_CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof host, cudaMemcpyDeviceToHost, stream_));
  SyncStream();
  return static_cast<int64_t>(host);
}

double CudaBackend::SumSquares(const Tensor& t) {
  MakeCurrent();
  CheckF32(t, "SumSquares");
  auto* out = ScalarSlot<double>(scalars_, kSumSlot);
  kernels::SumSquares(t.data<float>(), t.numel(), partials_.data<double>(), out, stream_);
  double host = 0;
  DPT_CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof host, cudaMemcpyDeviceToHost, stream_));
  SyncStream();
  return host;
}

}  // namespace dptrain::cuda
