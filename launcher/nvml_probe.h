// SPDX-License-Identifier: Apache-2.0
// The GPUs of this host as NVML sees them, without creating a CUDA context (binding must happen
// before the first CUDA call). NVML is loaded at run time: machines without a driver still run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dptrain {

struct GpuInfo {
  int index = -1;                              // NVML index = nvidia-smi index (PCI bus order)
  std::string name;                            // "NVIDIA H100 80GB HBM3"
  std::string uuid;                            // "GPU-8f6c1a2e-..."
  std::string pci_bus_id;                      // "00000000:1B:00.0"
  uint64_t memory_total = 0, memory_used = 0;  // bytes
};

struct GpuInventory {
  bool available = false;       // NVML answered
  std::string why;              // when not: "no NVIDIA driver (libnvidia-ml.so.1: ...)"
  std::string driver_version;   // "570.86.15"; empty when unknown
  int cuda_driver_version = 0;  // 12080 = 12.8; 0 when unknown
  std::vector<GpuInfo> gpus;
};

// Loads libnvidia-ml.so.1 with dlopen (no link-time dependency: the binary runs on machines
// without a driver) and lists the GPUs. Never throws; failures land in `why`.
GpuInventory ProbeGpus();

// The GPU table, like nvidia-smi: index, name, UUID, bus id, memory used / total; or why there
// is none ("no NVIDIA driver (...)").
std::string DescribeGpus(const GpuInventory& inventory);

}  // namespace dptrain
