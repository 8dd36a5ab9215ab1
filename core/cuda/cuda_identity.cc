// SPDX-License-Identifier: Apache-2.0
// Which physical GPU a CUDA backend runs on: its DeviceIdentity (name, UUID as nvidia-smi -L
// writes it: "GPU-..." for a whole GPU, "MIG-..." for a MIG instance; PCI bus id, memory, compute
// capability) and IdentityOf.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <optional>
#include <string>

#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_rules.h"
#include "core/error.h"

namespace dptrain::cuda {
namespace {

Uuid ToUuid(const CUuuid& u) {
  Uuid out{};
  std::copy(u.bytes, u.bytes + 16, out.begin());
  return out;
}

// The device's UUID by the driver API, without linking libcuda: `version` 11040 is
// cuDeviceGetUuid_v2 (a MIG instance's own UUID), 9020 the original cuDeviceGetUuid (the physical
// GPU's). nullopt when the driver does not offer it.
std::optional<Uuid> DriverUuid(int ordinal, unsigned int version) {
  void* get_device = nullptr;
  void* get_uuid = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &get_device, 2000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess ||
      cudaGetDriverEntryPointByVersion("cuDeviceGetUuid", &get_uuid, version, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  CUdevice dev = 0;
  if (reinterpret_cast<PFN_cuDeviceGet_v2000>(get_device)(&dev, ordinal) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  CUuuid u{};
  // Both versions share one signature (cudaTypedefs.h).
  if (reinterpret_cast<PFN_cuDeviceGetUuid_v11040>(get_uuid)(&u, dev) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  return ToUuid(u);
}

}  // namespace

DeviceIdentity ReadIdentity(int ordinal, const cudaDeviceProp& prop) {
  DeviceIdentity id;
  id.ordinal = ordinal;
  id.name = prop.name;
  // A MIG instance is named by its own UUID ("MIG-..."), which only cuDeviceGetUuid_v2 returns;
  // the original call returns the physical GPU's, shared by every instance on it.
  const std::optional<Uuid> device = DriverUuid(ordinal, 11040);
  id.uuid = DeviceUuidString(device.value_or(ToUuid(prop.uuid)), DriverUuid(ordinal, 9020));
  id.memory_total = prop.totalGlobalMem;
  id.cc_major = prop.major;
  id.cc_minor = prop.minor;
  char bus[32] = {0};
  DPT_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal));
  id.pci_bus_id = bus;
  return id;
}

DeviceIdentity IdentityOf(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  DPT_CHECK(cuda != nullptr) << "IdentityOf: backend '" << backend.name() << "' is not cuda";
  return cuda->identity();
}

}  // namespace dptrain::cuda
