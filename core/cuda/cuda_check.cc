// SPDX-License-Identifier: Apache-2.0
// Error text for the status codes of the CUDA runtime, cuDNN, cuBLAS and NCCL.
#include "core/cuda/cuda_check.h"

#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>

#include <cstdio>

#include "core/cuda/cublas_loader.h"

namespace dptrain::cuda::detail {

std::string CudaErrorText(cudaError_t e) {
  std::string s = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  switch (e) {
    case cudaErrorMemoryAllocation:
      s += "; hint: a smaller train.global_batch, train.accumulate > 1 or bf16 precision needs "
           "less memory";
      break;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
      s += "; hint: no usable GPU here (dptrain info shows what this process sees)";
      break;
    case cudaErrorInvalidDevice:
      s += "; hint: the device ordinal is not visible (check CUDA_VISIBLE_DEVICES and "
           "dist.device_binding)";
      break;
    case cudaErrorNoKernelImageForDevice:
      s += "; hint: this binary was not built for this GPU architecture "
           "(CMAKE_CUDA_ARCHITECTURES)";
      break;
    default:
      break;
  }
  return s;
}

std::string CudnnStatusText(int status) {
  std::string s = cudnnGetErrorString(static_cast<cudnnStatus_t>(status));
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (detail[0] != '\0') s += std::string(" (") + detail + ")";
  return s;
}

bool CudnnRefused(int status) {
  const int category = CUDNN_STATUS_CATEGORY(status);
  return category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM;
}

std::string CublasStatusText(int status) {
  // Only reached through a call into the loaded library (cublas_loader.h).
  const auto st = static_cast<cublasStatus_t>(status);
  const CublasApi& blas = Cublas();
  return std::string(blas.status_name(st)) + ": " + blas.status_string(st);
}

std::string NcclResultText(int result) {
  std::string s = ncclGetErrorString(static_cast<ncclResult_t>(result));
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') s += std::string(" (") + last + ")";
  return s + "; hint: NCCL_DEBUG=INFO shows what NCCL tried";
}

void SyncCheck(const char* expr, const char* file, int line) {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    ::dptrain::detail::Raise() & ::dptrain::detail::ErrorStream<CudaError>(file, line, "")
                                     << "after " << expr
                                     << " (DPTRAIN_SYNC_CHECKS): " << CudaErrorText(e);
  }
}

void Warn(const char* expr, const std::string& what, const char* file, int line) noexcept {
  std::fprintf(stderr, "%s%s:%d: warning: %s: %s\n", RankTag().c_str(),
               ::dptrain::detail::StripSourcePrefix(file), line, expr, what.c_str());
}

}  // namespace dptrain::cuda::detail
