// SPDX-License-Identifier: Apache-2.0
// Backend registry: CPU always, CUDA when compiled in and a device is present.
#include "core/backend_registry.h"

#include <memory>
#include <mutex>

#include "core/cpu/cpu_backend.h"
#include "core/error.h"
#if DPTRAIN_HAS_CUDA
#include "core/cuda/cuda_backend.h"
#endif

namespace dptrain {
namespace {
#if DPTRAIN_HAS_CUDA
int g_cuda_ordinal = 0;  // set by SelectDevice before the CUDA backend exists
#endif
}  // namespace

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
  static auto* cuda_backend = cuda::CreateCudaBackend(g_cuda_ordinal).release();
  return *cuda_backend;
#else
  DPT_THROW(UnsupportedError) << "backend '" << name << "' is not built into this binary";
#endif
}

void SelectDevice(const std::string& name, int ordinal) {
#if DPTRAIN_HAS_CUDA
  if (name == "cuda") g_cuda_ordinal = ordinal;
#else
  (void)name;
  (void)ordinal;
#endif
}

std::optional<DeviceInfo> BackendDevice(const Backend& backend) {
#if DPTRAIN_HAS_CUDA
  if (backend.device() == Device::kCuda) {
    const cuda::DeviceIdentity id = cuda::IdentityOf(backend);
    return DeviceInfo{id.ordinal, id.name, id.uuid, id.pci_bus_id, id.memory_total};
  }
#else
  (void)backend;
#endif
  return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> BackendLibraryVersions() {
  std::vector<std::pair<std::string, std::string>> out{{"oneDNN", cpu::OneDnnVersion()}};
#if DPTRAIN_HAS_CUDA
  for (auto& v : cuda::LibraryVersions()) out.push_back(std::move(v));
#endif
  return out;
}

}  // namespace dptrain
