// SPDX-License-Identifier: Apache-2.0
// Status checks for the CUDA runtime, cuDNN, cuBLAS and NCCL: every call's status is checked and
// a failure throws the typed, rank-tagged error of core/error.h with the failing expression
// and the library's own message. With DPTRAIN_SYNC_CHECKS=1 (CMake option, ON for debugging)
// every successful check also synchronises the device, so an asynchronous kernel fault is
// reported at the call that caused it instead of at some later call.
//
// Only cuda_runtime_api.h is included here (kernels.cu uses these macros too); the cuDNN, cuBLAS
// and NCCL status enums all have SUCCESS = 0 and are turned into text by functions in
// cuda_check.cc, which includes their headers.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

#ifndef DPTRAIN_SYNC_CHECKS
#define DPTRAIN_SYNC_CHECKS 0
#endif

namespace dptrain::cuda::detail {

// "cudaErrorMemoryAllocation: out of memory" plus a hint for the common failures.
std::string CudaErrorText(cudaError_t e);
std::string CudnnStatusText(int status);  // cudnnGetErrorString + cudnnGetLastErrorString
// Whether a cuDNN status is a refusal of the operands (NOT_SUPPORTED or BAD_PARAM, with their
// cuDNN 9 sub-codes) rather than a failure while running.
bool CudnnRefused(int status);
std::string CublasStatusText(int status);  // cublasGetStatusName: cublasGetStatusString
std::string NcclResultText(int result);    // ncclGetErrorString + ncclGetLastError
// DPTRAIN_SYNC_CHECKS: cudaDeviceSynchronize and throw CudaError naming `expr` on failure.
void SyncCheck(const char* expr, const char* file, int line);
// Prints a rank-tagged warning to stderr (destructors must not throw).
void Warn(const char* expr, const std::string& what, const char* file, int line) noexcept;

}  // namespace dptrain::cuda::detail

#if DPTRAIN_SYNC_CHECKS
#define DPT_CUDA_SYNC_AFTER_(expr) ::dptrain::cuda::detail::SyncCheck(expr, __FILE__, __LINE__)
#else
#define DPT_CUDA_SYNC_AFTER_(expr) (void)0
#endif

// DPT_CUDA_CHECK(cudaMalloc(&p, n)); throws CudaError. The sticky "last error" is cleared so a
// later cudaGetLastError() after a kernel launch does not report this failure again.
#define DPT_CUDA_CHECK(expr)                                                       \
  do {                                                                             \
    const cudaError_t dpt_cuda_e_ = (expr);                                        \
    if (dpt_cuda_e_ != cudaSuccess) {                                              \
      (void)cudaGetLastError();                                                    \
      DPT_THROW(::dptrain::CudaError)                                              \
          << #expr << ": " << ::dptrain::cuda::detail::CudaErrorText(dpt_cuda_e_); \
    }                                                                              \
    DPT_CUDA_SYNC_AFTER_(#expr);                                                   \
  } while (false)

// After every kernel launch: DPT_CUDA_CHECK_LAUNCH("ReluKernel");
#define DPT_CUDA_CHECK_LAUNCH(kernel)                                                         \
  do {                                                                                        \
    const cudaError_t dpt_cuda_l_ = cudaGetLastError();                                       \
    if (dpt_cuda_l_ != cudaSuccess) {                                                         \
      DPT_THROW(::dptrain::CudaError) << "launch of " << (kernel) << ": "                     \
                                      << ::dptrain::cuda::detail::CudaErrorText(dpt_cuda_l_); \
    }                                                                                         \
    DPT_CUDA_SYNC_AFTER_(kernel);                                                             \
  } while (false)

#define DPT_CUDNN_CHECK(expr)                                                                 \
  do {                                                                                        \
    const int dpt_cudnn_s_ = static_cast<int>(expr);                                          \
    if (dpt_cudnn_s_ != 0) {                                                                  \
      const std::string dpt_cudnn_m_ =                                                        \
          std::string(#expr) + ": " + ::dptrain::cuda::detail::CudnnStatusText(dpt_cudnn_s_); \
      if (::dptrain::cuda::detail::CudnnRefused(dpt_cudnn_s_)) {                              \
        DPT_THROW(::dptrain::CudnnRefusal) << dpt_cudnn_m_;                                   \
      }                                                                                       \
      DPT_THROW(::dptrain::CudnnError) << dpt_cudnn_m_;                                       \
    }                                                                                         \
    DPT_CUDA_SYNC_AFTER_(#expr);                                                              \
  } while (false)

#define DPT_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                  \
    const int dpt_cublas_s_ = static_cast<int>(expr);                                   \
    if (dpt_cublas_s_ != 0) {                                                           \
      DPT_THROW(::dptrain::CublasError)                                                 \
          << #expr << ": " << ::dptrain::cuda::detail::CublasStatusText(dpt_cublas_s_); \
    }                                                                                   \
    DPT_CUDA_SYNC_AFTER_(#expr);                                                        \
  } while (false)

// For calls that complete synchronously (ncclGetUniqueId, ncclGetVersion, ...). Collectives on a
// non-blocking communicator may also return ncclInProgress, which is not an error: the NCCL
// communicator handles those itself.
#define DPT_NCCL_CHECK(expr)                                                        \
  do {                                                                              \
    const int dpt_nccl_r_ = static_cast<int>(expr);                                 \
    if (dpt_nccl_r_ != 0) {                                                         \
      DPT_THROW(::dptrain::NcclError)                                               \
          << #expr << ": " << ::dptrain::cuda::detail::NcclResultText(dpt_nccl_r_); \
    }                                                                               \
  } while (false)

// In destructors and other no-throw paths: report, never throw.
#define DPT_CUDA_WARN(expr)                                                                     \
  do {                                                                                          \
    const cudaError_t dpt_cuda_w_ = (expr);                                                     \
    if (dpt_cuda_w_ != cudaSuccess) {                                                           \
      (void)cudaGetLastError();                                                                 \
      ::dptrain::cuda::detail::Warn(#expr, ::dptrain::cuda::detail::CudaErrorText(dpt_cuda_w_), \
                                    __FILE__, __LINE__);                                        \
    }                                                                                           \
  } while (false)
