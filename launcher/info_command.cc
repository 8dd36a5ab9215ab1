// SPDX-License-Identifier: Apache-2.0
// `dptrain info`: what this host offers (cores, GPUs, backends, libraries) and the binding each
// local rank would get; one process, no MPI.
#include "launcher/info_command.h"

#include <fmt/format.h>

#include <string>

#include "core/backend_registry.h"
#include "datasets/convert/convert.h"
#include "datasets/inspect.h"
#include "launcher/binding_policy.h"
#include "launcher/nvml_probe.h"
#include "launcher/process_env.h"
#include "runtime/comm/mpi_communicator.h"

namespace dptrain {

int RunInfoCommand(const DistConfig& dist) {
  fmt::print("dptrain {}\n", DPTRAIN_VERSION);
  const GetEnvFn getenv_fn = SystemGetEnv();
  const LauncherVars vars = ReadLauncherVars(getenv_fn);
  fmt::print("host {}: {} cores in the affinity mask", HostName(), AffinityCores());
  if (vars.local_rank) {
    fmt::print(", local rank {} (from {})", *vars.local_rank, vars.local_rank_source);
    // Under srun the size comes from SLURM_STEP_TASKS_PER_NODE (launcher/process_env.h).
    if (vars.local_size) fmt::print(" of {} (from {})", *vars.local_size, vars.local_size_source);
  }
  fmt::print("\n");
  // NVML first: it creates no CUDA context, and the binding lines below use its count.
  const GpuInventory gpus = ProbeGpus();
  fmt::print("{}", DescribeGpus(gpus));
  fmt::print("{}",
             DescribeBindings(dist, gpus, getenv_fn, vars.local_size.value_or(0), vars.local_rank));
  fmt::print("backends built: ");
  for (const auto& b : BuiltBackends()) fmt::print("{} ", b);
  fmt::print("\n");
  for (const auto& b : BuiltBackends()) {
    std::string why;
    const bool ok = BackendAvailable(b, &why);
    fmt::print("  {}: {}\n", b, ok ? "available" : "not available: " + why);
  }
  fmt::print("libraries:\n");
  for (const auto& [lib, version] : BackendLibraryVersions()) {
    fmt::print("  {:<13} {}\n", lib, version);
  }
  fmt::print("  {:<13} {}\n", "MPI", MpiSession::LibraryVersion());
  fmt::print("  {:<13} {}\n", "HDF5", Hdf5LibraryVersion());
  fmt::print("  {:<13} {}\n", "libvips", VipsLibraryVersion());  // convert --from imagefolder
  return 0;
}

}  // namespace dptrain
