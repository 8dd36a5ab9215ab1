// SPDX-License-Identifier: Apache-2.0
// Device binding's side effects (the decision is launcher/binding_policy.h): CUDA_VISIBLE_DEVICES
// and CUDA_DEVICE_ORDER set before the first CUDA call, the launcher's binder that decides before
// and after MPI_Init, and the collective check that no two ranks share a GPU.
#pragma once

#include <optional>
#include <string>

#include "launcher/binding_policy.h"
#include "launcher/nvml_probe.h"
#include "launcher/process_env.h"
#include "runtime/comm/communicator.h"
#include "runtime/run_config.h"

namespace dptrain {

// Collective: gathers every rank's BoundDevice over `comm`; every rank throws the same
// ConfigError when two ranks share a GPU (`sharing_requested`: DPTRAIN_ALLOW_GPU_SHARING is set,
// and the message explains why it cannot help). Returns the table on rank 0 and "" elsewhere.
// `tests_share` (TrainHooks::share_gpu, test-only) lets shared GPUs through; the table then
// ends with a line that says so.
std::string ExchangeBindings(ControlPlane& comm, const BoundDevice& mine, bool sharing_requested,
                             bool tests_share = false);

// Test-only (TrainHooks::share_gpu, BindGpuForTest): lets ranks that share one GPU form an NCCL
// communicator. NCCL refuses two ranks of a communicator with the same host hash on one device
// ("Duplicate GPU detected"); a host id of its own per rank (NCCL_HOSTID) makes every rank
// another host to NCCL, which then connects them over its socket transport on loopback
// (peer-to-peer, shared memory and InfiniBand off). Call before the first NCCL call. Returns
// the variables it set, as "NAME=value ..." for the log.
std::string ShareGpuOverNcclSockets(int rank);

// Applies a binding to this process's environment (setenv): CUDA_VISIBLE_DEVICES under remap,
// and CUDA_DEVICE_ORDER=PCI_BUS_ID when unset. Must run before the first CUDA call.
void ApplyBinding(const DeviceBinding& b);

// The launcher's binding step (RunTrainOrEval). Typical use:
//   GpuBinder binder(cfg.dist, getenv);  // before MPI_Init
//   if (vars.local_rank) binder.BindEarly(*vars.local_rank, vars.local_size.value_or(0));
//   MpiSession mpi(...);  // may initialise CUDA (CUDA-aware MPI)
//   RunAgreed(comm, [&] { kind = binder.Bind(local_rank, local_size); ... GetBackend(kind); });
// BindEarly applies the binding from the launcher's local rank before MPI_Init (a CUDA-aware MPI
// may initialise CUDA inside MPI_Init, after which CUDA_VISIBLE_DEVICES no longer matters); Bind
// decides again with MPI's local rank and size, applies the binding if BindEarly could not, and
// throws ConfigError when the two disagree or the binding is impossible.
class GpuBinder {
 public:
  GpuBinder(const DistConfig& dist, GetEnvFn getenv);

  // Never throws: a failure here is reported by Bind().
  void BindEarly(int local_rank, int local_size) noexcept;
  // "cpu" or "cuda" (dist.device resolved; see ResolveDeviceKind). For "cuda" the binding is
  // applied and binding() holds it.
  std::string Bind(int local_rank, int local_size);

  const std::optional<DeviceBinding>& binding() const { return binding_; }
  bool sharing_requested() const { return AllowGpuSharing(getenv_); }
  const GpuInventory& inventory();  // probed once, on first use

 private:
  std::string Resolve();
  BindingRequest Request(int local_rank, int local_size);

  const DistConfig& dist_;
  GetEnvFn getenv_;
  std::optional<std::string> visible_;  // CUDA_VISIBLE_DEVICES as the process started with it
  std::optional<GpuInventory> inventory_;
  std::optional<DeviceBinding> early_, binding_;
};

}  // namespace dptrain
