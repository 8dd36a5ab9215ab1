// SPDX-License-Identifier: Apache-2.0
// For multi-rank GPU tests (label cuda): binds each rank to its own GPU with the launcher's own
// rules (policy set-device, so every GPU stays visible and NCCL may use peer-to-peer) and agrees
// on every rank whether the test can run at all, with the reason when it cannot. On a machine
// with one GPU every rank takes it, and NCCL connects the ranks as hosts of their own over its
// socket transport (ShareGpuOverNcclSockets): the GPU machines lent to this project have one GPU,
// and the multi-rank GPU path must run there rather than skip.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "core/backend_registry.h"
#include "launcher/binding_policy.h"
#include "launcher/config.h"
#include "launcher/gpu_binder.h"
#include "launcher/nvml_probe.h"
#include "launcher/process_env.h"
#include "runtime/comm/communicator.h"

namespace dptrain::testing {

struct GpuRank {
  Backend* backend = nullptr;  // the CUDA backend on this rank's own GPU; null: skip
  std::string why_not;         // the same on every rank when backend is null
  std::string shared;          // ranks share one GPU: the NCCL variables set ("" otherwise)
};

// Collective over `comm`; call before anything touches CUDA.
inline GpuRank BindGpuForTest(ControlPlane& comm) {
  GpuRank out;
  std::string why;
  try {
    const GetEnvFn env = [](const char* n) { return std::getenv(n); };
    const LauncherVars vars = ReadLauncherVars(env);
    const int local_rank = vars.local_rank.value_or(comm.rank());
    const int local_size = vars.local_size.value_or(comm.size());
    DistConfig dist;
    dist.device_binding = BindingPolicy::kSetDevice;
    const GpuInventory inv = ProbeGpus();
    const std::vector<std::string> built = BuiltBackends();
    if (built.size() < 2) {
      why = "the CUDA backend is not built";
    } else if (!inv.available) {
      why = "no GPU: " + inv.why;
    } else {
      const DeviceBinding b =
          ChooseDevice(MakeBindingRequest(dist, local_rank, local_size, inv, env));
      if (b.candidates.size() == 1 && local_size > 1) {
        out.shared = ShareGpuOverNcclSockets(comm.rank());
      }
      if (static_cast<int>(b.candidates.size()) < local_size && out.shared.empty()) {
        why = "needs one GPU per rank: " + std::to_string(local_size) + " ranks on this host but " +
              std::to_string(b.candidates.size()) + " GPU(s) (" + b.source + ")";
      } else {
        ApplyBinding(b);  // CUDA_DEVICE_ORDER=PCI_BUS_ID, as the launcher: NVML's numbering
        SelectDevice("cuda", b.cuda_ordinal);
        if (BackendAvailable("cuda", &why)) out.backend = &GetBackend("cuda");
      }
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  const std::vector<std::string> all = comm.AllGatherStrings(why);
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) {
      out.backend = nullptr;
      out.why_not = "cuda: rank " + std::to_string(r) + ": " + all[r];
      break;
    }
  }
  if (out.backend != nullptr && !out.shared.empty() && comm.rank() == 0) {
    std::printf("[ NOTE     ] %d ranks share one GPU; NCCL over sockets (%s)\n", comm.size(),
                out.shared.c_str());
    std::fflush(stdout);
  }
  return out;
}

}  // namespace dptrain::testing
