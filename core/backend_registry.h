// SPDX-License-Identifier: Apache-2.0
// Which backends this build has, and the process-wide instance of each. The only place (with
// tests/testing/backends.cc) that knows whether CUDA was compiled in.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"

namespace dptrain {

// Names of the backends compiled into this binary, CPU first: {"cpu"} or {"cpu", "cuda"}.
std::vector<std::string> BuiltBackends();
// Whether `name` can be used on this machine now; if not, `why` says why (no device, not built).
bool BackendAvailable(const std::string& name, std::string* why);
// The process-wide backend (created on first use, lives until exit). Throws UnsupportedError
// naming the reason when it is not available.
Backend& GetBackend(const std::string& name);

// Which device of its kind GetBackend(name) will use when it first creates the backend: the CUDA
// device ordinal chosen by the launcher's binding (0 under remap). Call before GetBackend(name);
// ignored for "cpu" and for backends that are not built.
void SelectDevice(const std::string& name, int ordinal);

// The physical device a backend runs on, for the binding table and the uniqueness check.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;        // "NVIDIA H100 80GB HBM3"
  std::string uuid;        // "GPU-8f6c1a2e-..."
  std::string pci_bus_id;  // "0000:1B:00.0"
  size_t memory_total = 0;
};
// nullopt for the CPU backend.
std::optional<DeviceInfo> BackendDevice(const Backend& backend);

// (library, version) of every library the built backends use: oneDNN; with CUDA also the CUDA
// runtime and driver, cuDNN, cuBLAS and NCCL. Needs no GPU and creates no CUDA context.
std::vector<std::pair<std::string, std::string>> BackendLibraryVersions();

}  // namespace dptrain
