// SPDX-License-Identifier: Apache-2.0
// The GPU inventory from NVML, loaded with dlopen so that the binary needs no driver to start,
// and its nvidia-smi-like description for `dptrain info`. Creates no CUDA context.
#include "launcher/nvml_probe.h"

#include <dlfcn.h>

#include <cstdio>
#include <sstream>

#include "core/memory/caching_allocator.h"

namespace dptrain {
namespace {

// ---- NVML ABI (nvml.h is not installed here; these are the documented C declarations) ----------
using NvmlReturn = int;  // nvmlReturn_t; NVML_SUCCESS = 0
using NvmlDevice = struct NvmlDeviceSt*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvmlNameBuffer = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kNvmlUuidBuffer = 96;  // >= NVML_DEVICE_UUID_V2_BUFFER_SIZE (96)
constexpr unsigned kNvmlDriverBuffer = 80;
struct NvmlPciInfoV3 {  // nvmlPciInfo_t as filled by nvmlDeviceGetPciInfo_v3
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
struct NvmlMemory {  // nvmlMemory_t (v1)
  unsigned long long total, free, used;
};

}  // namespace

GpuInventory ProbeGpus() {
  GpuInventory inv;
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    inv.why =
        std::string("no NVIDIA driver (") + (err != nullptr ? err : "libnvidia-ml.so.1") + ")";
    return inv;
  }
  auto sym = [&](const char* name) { return dlsym(lib, name); };
  using InitFn = NvmlReturn (*)();
  using ErrFn = const char* (*)(NvmlReturn);
  using CountFn = NvmlReturn (*)(unsigned*);
  using HandleFn = NvmlReturn (*)(unsigned, NvmlDevice*);
  using StrFn = NvmlReturn (*)(NvmlDevice, char*, unsigned);
  using PciFn = NvmlReturn (*)(NvmlDevice, NvmlPciInfoV3*);
  using MemFn = NvmlReturn (*)(NvmlDevice, NvmlMemory*);
  using DrvFn = NvmlReturn (*)(char*, unsigned);
  using CudaDrvFn = NvmlReturn (*)(int*);
  auto init = reinterpret_cast<InitFn>(sym("nvmlInit_v2"));
  auto shutdown = reinterpret_cast<InitFn>(sym("nvmlShutdown"));
  auto error_string = reinterpret_cast<ErrFn>(sym("nvmlErrorString"));
  auto count_fn = reinterpret_cast<CountFn>(sym("nvmlDeviceGetCount_v2"));
  auto handle_fn = reinterpret_cast<HandleFn>(sym("nvmlDeviceGetHandleByIndex_v2"));
  auto name_fn = reinterpret_cast<StrFn>(sym("nvmlDeviceGetName"));
  auto uuid_fn = reinterpret_cast<StrFn>(sym("nvmlDeviceGetUUID"));
  auto pci_fn = reinterpret_cast<PciFn>(sym("nvmlDeviceGetPciInfo_v3"));
  auto mem_fn = reinterpret_cast<MemFn>(sym("nvmlDeviceGetMemoryInfo"));
  auto drv_fn = reinterpret_cast<DrvFn>(sym("nvmlSystemGetDriverVersion"));
  auto cuda_drv_fn = reinterpret_cast<CudaDrvFn>(sym("nvmlSystemGetCudaDriverVersion_v2"));
  if (cuda_drv_fn == nullptr) {
    cuda_drv_fn = reinterpret_cast<CudaDrvFn>(sym("nvmlSystemGetCudaDriverVersion"));
  }
  auto describe = [&](NvmlReturn rc) {
    return error_string != nullptr ? std::string(error_string(rc))
                                   : "NVML error " + std::to_string(rc);
  };
  if (init == nullptr || shutdown == nullptr || count_fn == nullptr || handle_fn == nullptr) {
    inv.why = "libnvidia-ml.so.1 lacks the NVML functions dptrain needs (driver too old?)";
    dlclose(lib);
    return inv;
  }
  if (const NvmlReturn rc = init(); rc != kNvmlSuccess) {
    inv.why = "NVML cannot start: " + describe(rc);
    dlclose(lib);
    return inv;
  }
  unsigned count = 0;
  if (const NvmlReturn rc = count_fn(&count); rc != kNvmlSuccess) {
    inv.why = "NVML cannot count the GPUs: " + describe(rc);
  } else {
    inv.available = true;
    char buf[kNvmlDriverBuffer] = {0};
    if (drv_fn != nullptr && drv_fn(buf, sizeof buf) == kNvmlSuccess) inv.driver_version = buf;
    int v = 0;
    if (cuda_drv_fn != nullptr && cuda_drv_fn(&v) == kNvmlSuccess) inv.cuda_driver_version = v;
    for (unsigned i = 0; i < count; ++i) {
      GpuInfo g;
      g.index = static_cast<int>(i);
      NvmlDevice dev = nullptr;
      if (handle_fn(i, &dev) != kNvmlSuccess) {
        g.name = "(not accessible)";
        inv.gpus.push_back(g);
        continue;
      }
      char name[kNvmlNameBuffer] = {0};
      if (name_fn != nullptr && name_fn(dev, name, sizeof name) == kNvmlSuccess) g.name = name;
      char uuid[kNvmlUuidBuffer] = {0};
      if (uuid_fn != nullptr && uuid_fn(dev, uuid, sizeof uuid) == kNvmlSuccess) g.uuid = uuid;
      NvmlPciInfoV3 pci{};
      if (pci_fn != nullptr && pci_fn(dev, &pci) == kNvmlSuccess) {
        pci.bus_id[sizeof pci.bus_id - 1] = '\0';
        g.pci_bus_id = pci.bus_id;
      }
      NvmlMemory mem{};
      if (mem_fn != nullptr && mem_fn(dev, &mem) == kNvmlSuccess) {
        g.memory_total = mem.total;
        g.memory_used = mem.used;
      }
      inv.gpus.push_back(g);
    }
  }
  shutdown();
  dlclose(lib);
  return inv;
}

std::string DescribeGpus(const GpuInventory& inv) {
  std::ostringstream os;
  if (!inv.available) {
    os << "GPUs: none visible to NVML: " << inv.why << "\n";
    return os.str();
  }
  os << "GPUs (NVML";
  if (!inv.driver_version.empty()) os << ", driver " << inv.driver_version;
  if (inv.cuda_driver_version > 0) {
    os << ", CUDA " << inv.cuda_driver_version / 1000 << "." << inv.cuda_driver_version % 1000 / 10;
  }
  os << "): " << inv.gpus.size() << "\n";
  if (inv.gpus.empty()) return os.str();
  char line[512];
  std::snprintf(line, sizeof line, "  %-4s %-28s %-41s %-17s %s\n", "idx", "name", "uuid", "bus id",
                "memory used / total");
  os << line;
  for (const auto& g : inv.gpus) {
    const std::string mem = FormatBytes(g.memory_used) + " / " + FormatBytes(g.memory_total);
    std::snprintf(line, sizeof line, "  %-4d %-28s %-41s %-17s %s\n", g.index, g.name.c_str(),
                  g.uuid.c_str(), g.pci_bus_id.c_str(), mem.c_str());
    os << line;
  }
  return os.str();
}

}  // namespace dptrain
