// SPDX-License-Identifier: Apache-2.0
// CUDA backend: linear layers on cuBLAS GEMMs (f32 compute, no TF32; 16-bit operands staged for
// bf16 / fp16), bias add and bias gradient in kernels.cu.
#include <cublas_v2.h>
#include <library_types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/cuda/cublas_loader.h"
#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels.h"
#include "core/error.h"

namespace dptrain::cuda {
namespace {

// Row-major PyTorch layouts on column-major cuBLAS.
// A row-major (r x c) matrix is the column-major (c x r) matrix, its transpose, with ld = c. So
//   y = x W^T    (n x out)  is  y^T = W x^T : gemm(T, N, m=out, n=n, k=in, A=W lda=in, B=x ldb=in)
//   dx = dy W    (n x in)   is  dx^T = W^T dy^T : gemm(N, N, m=in, n=n, k=out, A=W, B=dy ldb=out)
//   dW = dy^T x  (out x in) is  dW^T = x^T dy : gemm(N, T, m=in, n=out, k=n, A=x, B=dy ldb=out)
void Gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
          int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c,
          int64_t ldc, cudaDataType_t ab) {
  const float alpha = 1.f;
  DPT_CUBLAS_CHECK(
      Cublas().gemm_ex(h, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                       &alpha, a, ab, static_cast<int>(lda), b, ab, static_cast<int>(ldb), &beta, c,
                       CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct LinearPlan final : OpPlan {
  LinearDesc d;
  bool half = false;
  kernels::Half kind = kernels::Half::kBF16;
  cudaDataType_t ab = CUDA_R_32F;  // GEMM operand type
  Tensor x16, w16, dy16;
};

}  // namespace

std::shared_ptr<OpPlan> CudaBackend::PrepareLinear(const LinearDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cuda: linear " << d.ToString();
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot =
      linear_plans_[std::make_tuple(d.n, d.in, d.out, d.bias, static_cast<int>(d.precision))];
  if (slot) return slot;
  auto p = std::make_shared<LinearPlan>();
  p->d = d;
  p->half = IsHalf(d.precision);
  p->kind = HalfKind(d.precision);
  p->ab = !p->half ? CUDA_R_32F : d.precision == Precision::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  if (p->half) {
    const DType ht = HalfDType(d.precision);
    p->x16 = Empty(Shape{d.n * d.in}, ht, "linear 16-bit x");
    p->w16 = Empty(Shape{d.out * d.in}, ht, "linear 16-bit w");
    p->dy16 = Empty(Shape{d.n * d.out}, ht, "linear 16-bit dy");
  }
  slot = p;
  return p;
}

void CudaBackend::LinearForward(const OpPlan& plan, const Tensor& x, const Tensor& w,
                                const Tensor* b, Tensor* y) {
  OpScope scope(this, "linear_fwd");
  const auto& p = static_cast<const LinearPlan&>(plan);
  const LinearDesc& d = p.d;
  scope.set_flops(d.flops());
  CheckF32(x, "linear x");
  CheckF32(w, "linear w");
  CheckF32(*y, "linear y");
  CheckNumel(x, d.n * d.in, "linear x", d);
  CheckNumel(w, d.out * d.in, "linear w", d);
  CheckNumel(*y, d.n * d.out, "linear y", d);
  DPT_CHECK(!d.bias || b != nullptr) << "linear with bias needs a bias tensor";
  const void* xa = x.raw();
  const void* wa = w.raw();
  if (p.half) {
    kernels::F32ToHalf(p.kind, x.data<float>(), p.x16.raw(), x.numel(), stream_);
    kernels::F32ToHalf(p.kind, w.data<float>(), p.w16.raw(), w.numel(), stream_);
    xa = p.x16.raw();
    wa = p.w16.raw();
  }
  Gemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, d.out, d.n, d.in, wa, d.in, xa, d.in, 0.f,
       y->data<float>(), d.out, p.ab);
  if (d.bias) {
    CheckF32(*b, "linear b");
    CheckNumel(*b, d.out, "linear b", d);
    kernels::AddBiasRows(y->data<float>(), b->data<float>(), d.n, d.out, stream_);
  }
}

void CudaBackend::LinearBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                     Tensor* dx) {
  OpScope scope(this, "linear_bwd_data");
  const auto& p = static_cast<const LinearPlan&>(plan);
  const LinearDesc& d = p.d;
  scope.set_flops(d.flops());
  CheckF32(dy, "linear dy");
  CheckF32(w, "linear w");
  CheckF32(*dx, "linear dx");
  CheckNumel(dy, d.n * d.out, "linear dy", d);
  CheckNumel(w, d.out * d.in, "linear w", d);
  CheckNumel(*dx, d.n * d.in, "linear dx", d);
  const void* dya = dy.raw();
  const void* wa = w.raw();
  if (p.half) {
    kernels::F32ToHalf(p.kind, dy.data<float>(), p.dy16.raw(), dy.numel(), stream_);
    kernels::F32ToHalf(p.kind, w.data<float>(), p.w16.raw(), w.numel(), stream_);
    dya = p.dy16.raw();
    wa = p.w16.raw();
  }
  Gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, d.in, d.n, d.out, wa, d.in, dya, d.out, 0.f,
       dx->data<float>(), d.in, p.ab);
}

void CudaBackend::LinearBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                        Tensor* dw, Tensor* db, bool accumulate) {
  OpScope scope(this, "linear_bwd_weights");
  const auto& p = static_cast<const LinearPlan&>(plan);
  const LinearDesc& d = p.d;
  scope.set_flops(d.flops());
  CheckF32(x, "linear x");
  CheckF32(dy, "linear dy");
  CheckF32(*dw, "linear dw");
  CheckNumel(x, d.n * d.in, "linear x", d);
  CheckNumel(dy, d.n * d.out, "linear dy", d);
  CheckNumel(*dw, d.out * d.in, "linear dw", d);
  const void* xa = x.raw();
  const void* dya = dy.raw();
  if (p.half) {
    kernels::F32ToHalf(p.kind, x.data<float>(), p.x16.raw(), x.numel(), stream_);
    kernels::F32ToHalf(p.kind, dy.data<float>(), p.dy16.raw(), dy.numel(), stream_);
    xa = p.x16.raw();
    dya = p.dy16.raw();
  }
  // beta = 1 accumulates into the f32 gradient (cuBLAS does not read C when beta = 0).
  Gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, d.in, d.out, d.n, xa, d.in, dya, d.out,
       accumulate ? 1.f : 0.f, dw->data<float>(), d.in, p.ab);
  if (d.bias) {
    DPT_CHECK(db != nullptr) << "linear with bias needs a bias gradient";
    CheckF32(*db, "linear db");
    CheckNumel(*db, d.out, "linear db", d);
    kernels::ColumnSums(dy.data<float>(), d.n, d.out, db->data<float>(), accumulate, stream_);
  }
}

}  // namespace dptrain::cuda
