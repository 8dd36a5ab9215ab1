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
  ReluGrad(y, dy, nullptr, dx);
}

// No sampled part (b_stride 1): this backend writes no sampled input gradient (Conv2dDesc::dx_sub).
void CudaBackend::ReluBackwardSum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b,
                                  int64_t b_stride, Tensor* dx) {
  OpScope scope(this, "relu_bwd");
  DPT_CHECK(b_stride == 1) << "cuda: a sampled gradient part (stride " << b_stride << ")";
  ReluGrad(y, dy_a, &dy_b, dx);
}

void CudaBackend::ReluGrad(const Tensor& y, const Tensor& dy, const Tensor* dy2, Tensor* dx) {
  // y: f32, or bf16 for a residual sum that only bf16 convolutions read (bf16_sums).
  const kernels::Elem yt = F32OrBf16Elem(y, "relu y");
  for (const Tensor* g : {&dy, dy2}) {
    if (g == nullptr) continue;
    CheckF32(*g, "relu dy");
    CheckSame(y, *g, "relu backward");
  }
  CheckF32(*dx, "relu dx");
  CheckSame(y, *dx, "relu backward");
  if (yt == kernels::Elem::kF32 && dy2 == nullptr) {
    kernels::ReluBackward(y.data<float>(), dy.data<float>(), dx->data<float>(), y.numel(), stream_);
  } else {
    kernels::ReluBackwardTyped(y.raw(), yt, dy.data<float>(),
                               dy2 != nullptr ? dy2->data<float>() : nullptr, dx->data<float>(),
                               y.numel(), stream_);
  }
}

void CudaBackend::ActivationForward(const ew::Activation& f, const Tensor& x, Tensor* y) {
  OpScope scope(this, "activation_fwd");
  CheckF32(x, "activation x");
  CheckF32(*y, "activation y");
  CheckSame(x, *y, "activation");
  kernels::Activate(f, x.data<float>(), y->data<float>(), x.numel(), stream_);
}

void CudaBackend::ActivationBackward(const ew::Activation& f, const Tensor& x, const Tensor& y,
                                     const Tensor& dy, Tensor* dx) {
  OpScope scope(this, "activation_bwd");
  CheckF32(x, "activation x");
  CheckF32(y, "activation y");
  CheckF32(dy, "activation dy");
  CheckF32(*dx, "activation dx");
  CheckSame(x, y, "activation backward");
  CheckSame(x, dy, "activation backward");
  CheckSame(x, *dx, "activation backward");
  kernels::ActivateBackward(f, x.data<float>(), y.data<float>(), dy.data<float>(),
                            dx->data<float>(), x.numel(), stream_);
}

namespace {
// The operand checks Add and AddRelu share: f32 tensors of one size.
void CheckAddOperands(const Tensor& a, const Tensor& b, const Tensor& y) {
  CheckF32(a, "add a");
  CheckF32(b, "add b");
  CheckF32(y, "add y");
  CheckSame(a, b, "add");
  CheckSame(a, y, "add");
}
}  // namespace

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor* y) {
  OpScope scope(this, "add");
  CheckAddOperands(a, b, *y);
  kernels::Add(a.data<float>(), b.data<float>(), y->data<float>(), a.numel(), stream_);
}

void CudaBackend::AddRelu(const Tensor& a, const Tensor& b, Tensor* y) {
  OpScope scope(this, "add_relu");
  CheckAddOperands(a, b, *y);
  kernels::AddRelu(a.data<float>(), b.data<float>(), y->data<float>(), a.numel(), stream_);
}

void CudaBackend::MulRows(const Tensor& x, const Tensor& s, Tensor* y) {
  OpScope scope(this, "mul_rows");
  CheckF32(x, "mul_rows x");
  CheckF32(s, "mul_rows s");
  CheckF32(*y, "mul_rows y");
  CheckSame(x, *y, "mul_rows");
  const int64_t rows = s.numel();
  kernels::MulRows(x.data<float>(), s.data<float>(), y->data<float>(), rows,
                   RowLength(x.numel(), rows, "mul_rows"), stream_);
}

void CudaBackend::AddRows(const Tensor& x, const Tensor& s, Tensor* y) {
  OpScope scope(this, "add_rows");
  CheckF32(x, "add_rows x");
  CheckF32(s, "add_rows s");
  CheckF32(*y, "add_rows y");
  CheckSame(x, *y, "add_rows");
  const int64_t rows = s.numel();
  kernels::AddRows(x.data<float>(), s.data<float>(), y->data<float>(), rows,
                   RowLength(x.numel(), rows, "add_rows"), stream_);
}

void CudaBackend::RowDot(const Tensor& dy, const Tensor& x, Tensor* ds) {
  OpScope scope(this, "row_dot");
  CheckF32(dy, "row_dot dy");
  CheckF32(x, "row_dot x");
  CheckF32(*ds, "row_dot ds");
  CheckSame(dy, x, "row_dot");
  const int64_t rows = ds->numel();
  kernels::RowDot(dy.data<float>(), x.data<float>(), ds->data<float>(), rows,
                  RowLength(x.numel(), rows, "row_dot"), stream_);
}

void CudaBackend::RowSum(const Tensor& dy, Tensor* ds) {
  OpScope scope(this, "row_sum");
  CheckF32(dy, "row_sum dy");
  CheckF32(*ds, "row_sum ds");
  const int64_t rows = ds->numel();
  kernels::RowDot(dy.data<float>(), nullptr, ds->data<float>(), rows,
                  RowLength(dy.numel(), rows, "row_sum"), stream_);
}

void CudaBackend::Pad2d(const Tensor& x, int64_t top, int64_t left, Tensor* y) {
  OpScope scope(this, "pad2d");
  CheckDev(x, "pad2d x");
  CheckDev(*y, "pad2d y");
  const PadDims d = CheckPad2d(x, *y);
  kernels::Pad2d(x.data<float>(), y->data<float>(), d.planes, d.h, d.w, d.out_h, d.out_w, top, left,
                 stream_);
}

void CudaBackend::ToChannelsLast(const Tensor& x, Tensor* y) {
  OpScope scope(this, "to_channels_last");
  CheckDev(x, "to_channels_last x");
  CheckDev(*y, "to_channels_last y");
  const LayoutDims d = CheckLayoutChange(x, *y, "to_channels_last");
  kernels::ToChannelsLast(x.data<float>(), y->data<float>(), d.n, d.c, d.hw, stream_);
}

void CudaBackend::FromChannelsLast(const Tensor& x, Tensor* y) {
  OpScope scope(this, "from_channels_last");
  CheckDev(x, "from_channels_last x");
  CheckDev(*y, "from_channels_last y");
  const LayoutDims d = CheckLayoutChange(x, *y, "from_channels_last");
  kernels::FromChannelsLast(x.data<float>(), y->data<float>(), d.n, d.c, d.hw, stream_);
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
