// SPDX-License-Identifier: Apache-2.0
// cuBLAS, loaded with dlopen when the CUDA backend first needs it instead of linked: libcublas
// brings libcublasLt, whose initialisers run ~0.4 s of CPU in every process that loads it
// (dlopen timed on a 2-core AMD EPYC VM: 370-430 ms; libcudart, cuDNN and NCCL 2-6 ms each). A
// linked cuBLAS made every dptrain process pay that: CPU training, `dptrain --help`, each rank
// of an mpirun, each test executable.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace dptrain::cuda {

// The entry points dptrain calls, with cuBLAS's own declared types (cublas_v2.h maps
// cublasCreate and friends to their _v2 symbols).
struct CublasApi {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetWorkspace) set_workspace = nullptr;
  // cublasGemmEx's C declaration (cublas_api.h adds a C++ overload taking cudaDataType).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetProperty) get_property = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The library this build was compiled against (libcublas.so.<CUBLAS_VER_MAJOR>), loaded and
// resolved on the first call (thread-safe; later calls return the same table). Throws
// UnsupportedError (exit 2: a setup problem, not a bug) naming the file and the loader's reason
// when it cannot be loaded or lacks an entry point.
const CublasApi& Cublas();

// As Cublas(), but nullptr with *why set instead of throwing (`dptrain info`).
const CublasApi* TryCublas(std::string* why);

}  // namespace dptrain::cuda
