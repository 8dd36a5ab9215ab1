// SPDX-License-Identifier: Apache-2.0
// Which physical GPU a CUDA backend runs on: its DeviceIdentity (name, UUID in nvidia-smi's
// "GPU-xxxxxxxx-..." form, PCI bus id, memory, compute capability) and IdentityOf.
#include <cuda_runtime.h>

#include <string>

#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_check.h"
#include "core/error.h"

namespace dptrain::cuda {
namespace {

std::string FormatUuid(const cudaUUID_t& u) {
  static const char* hex = "0123456789abcdef";
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    const auto b = static_cast<unsigned char>(u.bytes[i]);
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

}  // namespace

DeviceIdentity ReadIdentity(int ordinal, const cudaDeviceProp& prop) {
  DeviceIdentity id;
  id.ordinal = ordinal;
  id.name = prop.name;
  id.uuid = FormatUuid(prop.uuid);
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
