// SPDX-License-Identifier: Apache-2.0
// Backend registry: CPU always, CUDA when compiled in and a device is present.
#include "runtime/backend_registry.h"

#include <memory>
#include <mutex>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/error.h"
#if DPTRAIN_HAS_CUDA
#include "runtime/cuda/cuda_backend.h"
#endif

namespace dptrain {

std::vector<std::string> BuiltBackends() {
#if DPTRAIN_HAS_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

bool BackendAvailable(const std::string& name, std::string* why) {
  if (name == "cpu") return true;
#if DPTRAIN_HAS_CUDA
  if (name == "cuda") return cuda::DeviceAvailable(why);
#endif
  if (why != nullptr) *why = "backend '" + name + "' is not built into this binary";
  return false;
}

Backend& GetBackend(const std::string& name) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (name == "cpu") {
    // Intentionally never destroyed: tensors held by statics may outlive main().
    static auto* cpu = new cpu::CpuBackend();
    return *cpu;
  }
  std::string why;
  if (!BackendAvailable(name, &why)) DPT_THROW(UnsupportedError) << why;
#if DPTRAIN_HAS_CUDA
  static auto* cuda_backend = cuda::CreateCudaBackend().release();
  return *cuda_backend;
#else
  DPT_THROW(UnsupportedError) << "backend '" << name << "' is not built into this binary";
#endif
}

}  // namespace dptrain
