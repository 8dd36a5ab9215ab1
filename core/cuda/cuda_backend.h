// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's public face: whether a GPU can be used, the factory, which physical GPU a
// backend runs on, and library versions. No CUDA header is included, so the registry (and only
// the registry: STYLE.md section 2) can call it from plain C++.
//
// Ordering rule: CUDA reads CUDA_VISIBLE_DEVICES once, when the driver initialises (the first
// CUDA call of the process, DeviceAvailable included). The launcher therefore binds the device
// (launcher/gpu_binder.h) before calling anything here.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"

namespace dptrain::cuda {

// True when the CUDA runtime sees at least one device. Otherwise `why` says why, e.g.
// "no CUDA device (cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA
// runtime version)". Never throws.
bool DeviceAvailable(std::string* why);

// The CUDA backend on device `ordinal` (0 under the remap binding, the chosen ordinal under
// set-device): one compute stream, cuDNN and cuBLAS handles, a caching allocator over cudaMalloc.
// Throws CudaError / CudnnError / CublasError when the device or a library cannot start.
std::unique_ptr<Backend> CreateCudaBackend(int ordinal = 0);

struct DeviceIdentity {
  int ordinal = 0;
  std::string name;        // "NVIDIA H100 80GB HBM3"
  std::string uuid;        // "GPU-8f6c1a2e-...", as nvidia-smi -L prints it
  std::string pci_bus_id;  // "0000:1B:00.0"
  size_t memory_total = 0;
  int cc_major = 0, cc_minor = 0;  // compute capability
};

// The device a CUDA backend runs on. Throws InternalError when `backend` is not a CUDA backend.
DeviceIdentity IdentityOf(const Backend& backend);

// Versions of the CUDA runtime and driver, cuDNN, cuBLAS and NCCL, as (library, version); works
// without a GPU ("CUDA driver" is "none" then). Does not create a CUDA context.
std::vector<std::pair<std::string, std::string>> LibraryVersions();

}  // namespace dptrain::cuda
