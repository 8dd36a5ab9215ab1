// SPDX-License-Identifier: Apache-2.0
// The side effects of device binding: the environment a binding sets before the first CUDA call,
// the launcher's two-step binder (before and after MPI_Init) and the collective uniqueness check.
#include "launcher/gpu_binder.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "core/backend_registry.h"
#include "core/error.h"

namespace dptrain {

std::string ExchangeBindings(ControlPlane& comm, const BoundDevice& mine, bool sharing_requested,
                             bool tests_share) {
  auto clean = [](std::string s) {
    std::replace(s.begin(), s.end(), '\t', ' ');
    return s;
  };
  std::ostringstream row;
  row << mine.rank << '\t' << clean(mine.host) << '\t' << mine.local_rank << '\t'
      << clean(mine.entry) << '\t' << clean(mine.name) << '\t' << clean(mine.uuid) << '\t'
      << clean(mine.pci_bus_id);
  std::vector<BoundDevice> rows;
  for (const auto& r : comm.AllGatherStrings(row.str())) {
    std::istringstream is(r);
    BoundDevice d;
    std::string rank, local;
    std::getline(is, rank, '\t');
    std::getline(is, d.host, '\t');
    std::getline(is, local, '\t');
    std::getline(is, d.entry, '\t');
    std::getline(is, d.name, '\t');
    std::getline(is, d.uuid, '\t');
    std::getline(is, d.pci_bus_id, '\t');
    d.rank = std::atoi(rank.c_str());
    d.local_rank = std::atoi(local.c_str());
    rows.push_back(d);
  }
  // Every rank holds the same rows, so every rank reaches the same verdict.
  // Never skipped: NCCL would reject the pair anyway ("Duplicate GPU detected"), later and
  // with a less helpful message.
  const std::string shared = FindSharedGpu(rows);
  if (!shared.empty() && !tests_share) {
    DPT_THROW(ConfigError) << shared
                           << (sharing_requested ? "; " + std::string(kNoGpuSharing) : "");
  }
  if (comm.rank() != 0) return "";
  std::string table = FormatBindingTable(rows);
  if (!shared.empty()) {
    table += "test hook: ranks share a GPU, NCCL between them over sockets (" + shared + ")\n";
  }
  return table;
}

std::string ShareGpuOverNcclSockets(int rank) {
  const std::string host_id = "dptrain-shared-gpu-rank-" + std::to_string(rank);
  const std::pair<const char*, std::string> vars[] = {
      {"NCCL_HOSTID", host_id}, {"NCCL_P2P_DISABLE", "1"}, {"NCCL_SHM_DISABLE", "1"},
      {"NCCL_IB_DISABLE", "1"}, {"NCCL_NVLS_ENABLE", "0"}, {"NCCL_SOCKET_IFNAME", "lo"},
  };
  std::string set;
  for (const auto& [name, value] : vars) {
    setenv(name, value.c_str(), 1);
    if (!set.empty()) set += ' ';
    set.append(name).append(1, '=').append(value);
  }
  return set;
}

void ApplyBinding(const DeviceBinding& b) {
  // CUDA numbers devices fastest-first unless told otherwise; nvidia-smi, NVML and Slurm number
  // them by PCI bus. Make CUDA agree, so "GPU 2" means the same thing everywhere.
  if (std::getenv("CUDA_DEVICE_ORDER") == nullptr) setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
  if (b.set_visible) setenv("CUDA_VISIBLE_DEVICES", b.set_visible->c_str(), 1);
}

GpuBinder::GpuBinder(const DistConfig& dist, GetEnvFn getenv)
    : dist_(dist), getenv_(std::move(getenv)) {
  if (const char* v = getenv_("CUDA_VISIBLE_DEVICES")) visible_ = v;
}

const GpuInventory& GpuBinder::inventory() {
  if (!inventory_) inventory_ = ProbeGpus();
  return *inventory_;
}

std::string GpuBinder::Resolve() {
  if (dist_.device == DeviceChoice::kCpu) return "cpu";
  const auto built = BuiltBackends();
  const bool cuda_built = std::find(built.begin(), built.end(), "cuda") != built.end();
  return ResolveDeviceKind(ConfigName(dist_.device), cuda_built, inventory(), visible_);
}

BindingRequest GpuBinder::Request(int local_rank, int local_size) {
  BindingRequest r = MakeBindingRequest(dist_, local_rank, local_size, inventory(), getenv_);
  r.cuda_visible_devices = visible_;  // not what an earlier ApplyBinding set
  return r;
}

void GpuBinder::BindEarly(int local_rank, int local_size) noexcept {
  try {
    if (Resolve() != "cuda") return;
    const auto built = BuiltBackends();
    if (std::find(built.begin(), built.end(), "cuda") == built.end()) return;
    DeviceBinding b = ChooseDevice(Request(local_rank, local_size));
    ApplyBinding(b);
    early_ = std::move(b);
  } catch (const std::exception&) {
    // Bind() decides again once MPI can tell every rank about it.
  }
}

std::string GpuBinder::Bind(int local_rank, int local_size) {
  std::string kind = Resolve();
  if (kind != "cuda") return kind;
  // Not built: GetBackend("cuda") explains that.
  const auto built = BuiltBackends();
  if (std::find(built.begin(), built.end(), "cuda") == built.end()) return kind;
  DeviceBinding b = ChooseDevice(Request(local_rank, local_size));
  if (early_ && early_->entry != b.entry) {
    DPT_THROW(ConfigError) << "device binding: the launcher's environment gave local rank "
                           << local_rank << " GPU " << early_->entry << " before MPI started, "
                           << "but MPI's local rank and size give GPU " << b.entry
                           << "; launch with one tool (mpirun or srun), not both";
  }
  if (!early_) ApplyBinding(b);
  binding_ = std::move(b);
  return kind;
}

}  // namespace dptrain
