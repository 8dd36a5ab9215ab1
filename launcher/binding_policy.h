// SPDX-License-Identifier: Apache-2.0
// Which GPU each rank uses (DESIGN.md section 4, "Device binding"), the pure decision: from the
// launcher's local rank and size, CUDA_VISIBLE_DEVICES (unset is not the same as empty),
// dist.gpus, dist.device_binding and the GPU count that NVML reports (launcher/nvml_probe.h).
// launcher/gpu_binder.h applies the decision to the environment before any CUDA call, and after
// the backend exists the ranks exchange (host, GPU UUID, PCI bus id) and refuse to run two ranks
// on one GPU (FindSharedGpu, below).
//
// The rules, in order:
//  1. Candidates. CUDA_VISIBLE_DEVICES set: its entries (indices, GPU-<uuid>, MIG-<uuid>; spaces
//     around entries are ignored). Set but empty, or "-1": no GPU may be used (an error for
//     dist.device = "cuda"; "auto" falls back to the CPU). Unset: every GPU NVML counts, as
//     indices 0..n-1 in nvidia-smi order (the launcher sets CUDA_DEVICE_ORDER=PCI_BUS_ID when it
//     is unset, so CUDA numbers the GPUs the same way).
//     dist.gpus narrows the candidates like PyTorch's device_ids=[2,3]: with CUDA_VISIBLE_DEVICES
//     set, an index is a position in that list and a UUID / MIG id must be one of its entries;
//     unset, the entries are taken as they are. Empty, duplicate or malformed entries and indices
//     beyond the GPU count are errors that quote the offending value.
//  2. Choice. Exactly one candidate: every local rank uses it. This is Slurm's one-GPU-per-task
//     case (--gpus-per-task=1: each task sees its own single GPU as "0"); if the ranks really do
//     land on one GPU, the uniqueness check after binding stops them. A per-task list from srun
//     (CUDA_VISIBLE_DEVICES with fewer entries than the step's GPUs on this node, as
//     --gpus-per-task=N>1 gives; see ReadLauncherVars): every rank takes the first entry of its
//     own list, with a warning that the others stay idle. Otherwise local rank r takes
//     candidate r, and more local ranks than candidates is an error. GPUs are never shared:
//     gradients of a GPU run go over NCCL, which refuses two ranks on one GPU, and the MPI
//     communicator has no host staging for device memory (DPTRAIN_ALLOW_GPU_SHARING=1 only
//     changes the message to say so).
//  3. Policy. "remap": CUDA_VISIBLE_DEVICES becomes the chosen entry, so the process sees exactly
//     one GPU as device 0 and never creates a context on another. "set-device": the environment
//     stays as it is and the process calls cudaSetDevice on the chosen entry's CUDA ordinal (for
//     sites where NCCL's intra-node peer-to-peer needs every GPU visible).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/nvml_probe.h"
#include "launcher/process_env.h"
#include "runtime/run_config.h"

namespace dptrain {

// "remap" | "set-device"; anything else is a ConfigError.
BindingPolicy ParseBindingPolicy(std::string_view text);

struct BindingRequest {
  int local_rank = 0;
  int local_size = 0;  // ranks on this host; 0 = not known yet (the count check is skipped)
  std::optional<std::string> cuda_visible_devices;  // nullopt = unset; "" = set but empty
  std::string gpus;                                 // dist.gpus / --gpus; empty = not given
  BindingPolicy policy = BindingPolicy::kRemap;
  bool allow_sharing = false;             // DPTRAIN_ALLOW_GPU_SHARING: only explained in errors
  std::optional<int> device_count;        // GPUs NVML counts; nullopt = unknown (no NVML)
  std::string device_count_why;           // why the count is unknown, for messages
  std::vector<std::string> device_uuids;  // by NVML index, when known (UUIDs under set-device)
  // Under srun only (LauncherVars): the step's GPUs on this node (SLURM_GPUS_ON_NODE) and
  // --gpus-per-task (SLURM_GPUS_PER_TASK); nullopt = not said.
  std::optional<int> slurm_gpus_on_node;
  std::optional<int> slurm_gpus_per_task;
};

struct DeviceBinding {
  std::string entry;  // the chosen device as CUDA names it: "3", "GPU-…", "MIG-…"
  std::vector<std::string> candidates;  // the list it was chosen from
  std::string source;                   // where the candidates came from, for messages
  int slot = 0;                         // entry == candidates[slot]
  bool per_task = false;                // candidates are this srun task's own list
  std::string warning;                  // non-empty: GPUs of this task's list left idle
  // remap: the value CUDA_VISIBLE_DEVICES must get; nullopt: leave the environment alone.
  std::optional<std::string> set_visible;
  int cuda_ordinal = 0;  // what the process passes to cudaSetDevice (0 under remap)

  // "GPU-1b2c… (candidate 1 of CUDA_VISIBLE_DEVICES=0,1,2,3), CUDA_VISIBLE_DEVICES=1"
  std::string Describe() const;
};

// True when the environment hides every GPU from CUDA: CUDA_VISIBLE_DEVICES set to "" (or only
// spaces) or with "-1" as its first entry.
bool VisibleDevicesHideAll(const std::optional<std::string>& cuda_visible_devices);

// The device for `r.local_rank`, by the rules at the top of this file. Throws ConfigError with
// a message that names the variable or key at fault and what to change.
DeviceBinding ChooseDevice(const BindingRequest& r);

// ---- after the backend exists: every rank on its own GPU --------------------------------------

struct BoundDevice {
  int rank = 0;
  std::string host;
  int local_rank = 0;
  std::string entry;  // DeviceBinding::entry
  std::string name, uuid, pci_bus_id;
};

// The message naming two ranks on one GPU (by UUID, or by host and PCI bus id when a UUID is
// missing), or "" when every rank has its own. Pure.
std::string FindSharedGpu(const std::vector<BoundDevice>& rows);
// The table rank 0 prints: rank, host, local rank, entry, name, UUID, bus id. Pure.
std::string FormatBindingTable(const std::vector<BoundDevice>& rows);

// ---- from the config and the environment ------------------------------------------------------

// DPTRAIN_ALLOW_GPU_SHARING=1|true|yes. It once let two ranks share a GPU; NCCL refuses that
// ("Duplicate GPU detected"), so now it only makes the errors say why sharing is impossible.
bool AllowGpuSharing(const GetEnvFn& getenv);
// The explanation appended to those errors.
extern const char* const kNoGpuSharing;

// The request for this process from the config, the environment and the inventory.
BindingRequest MakeBindingRequest(const DistConfig& dist, int local_rank, int local_size,
                                  const GpuInventory& inventory, const GetEnvFn& getenv);

// What `dist.device` resolves to before any CUDA call: "cpu" stays "cpu"; "cuda" stays "cuda";
// "auto" is "cuda" when the CUDA backend is built, NVML lists at least one GPU and
// CUDA_VISIBLE_DEVICES does not hide them all, else "cpu". Pure.
std::string ResolveDeviceKind(const std::string& configured, bool cuda_built,
                              const GpuInventory& inventory,
                              const std::optional<std::string>& cuda_visible_devices);

// ---- `dptrain info` -----------------------------------------------------------------------------

// The device each local rank 0..local_size-1 would get under the current environment and `dist`
// (or the error it would get). local_size 0: the launcher's OMPI_COMM_WORLD_LOCAL_SIZE etc. is
// not known, so one rank per candidate device is assumed. When CUDA_VISIBLE_DEVICES is this srun
// task's own list (DeviceBinding::per_task), only `own_local_rank` is described: the other tasks
// hold other lists.
std::string DescribeBindings(const DistConfig& dist, const GpuInventory& inventory,
                             const GetEnvFn& getenv, int local_size,
                             std::optional<int> own_local_rank = std::nullopt);

}  // namespace dptrain
