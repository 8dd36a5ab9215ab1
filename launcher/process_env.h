// SPDX-License-Identifier: Apache-2.0
// Who this process is: rank and world from MPI, local rank and local size from
// MPI_Comm_split_type(SHARED), cross-checked against the launcher's environment variables (read
// before MPI_Init, before any CUDA call), host name, and compute threads.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "runtime/comm/communicator.h"

namespace dptrain {

// What the launcher told us through the environment. Pure: `getenv` is injected for tests.
struct LauncherVars {
  std::optional<int> local_rank;
  std::optional<int> local_size;
  std::string local_rank_source;  // the variable local_rank came from, e.g.
                                  // "OMPI_COMM_WORLD_LOCAL_RANK"; empty when none
  std::string launcher;           // "mpirun (Open MPI)", "MPICH/Hydra", "MVAPICH", "srun", ""
};
// Precedence (DESIGN.md section 4): OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// MV2_COMM_WORLD_LOCAL_RANK, PMI_LOCAL_RANK; SLURM_LOCALID only when none of those exists
// (under mpirun inside an allocation it is 0 on every rank). Malformed values -> ConfigError.
LauncherVars ReadLauncherVars(const std::function<const char*(const char*)>& getenv);

// Compute threads for this rank: dist.threads when > 0; else OMP_NUM_THREADS when set; else,
// when the launcher pinned the process to a subset of the node (affinity < online cores), the
// cores of its mask; else the node's cores divided by the ranks on this node; at least 1.
int ChooseThreads(int64_t configured, const char* omp_num_threads, int affinity_cores,
                  int online_cores, int local_size);
int AffinityCores();  // cores in this process's sched_getaffinity mask
int OnlineCores();    // cores online on this node

struct ProcessEnv {
  int rank = 0, world = 1;
  int local_rank = 0, local_size = 1;
  std::string host;
  LauncherVars vars;
};

// Throws ConfigError when the launcher's local rank contradicts MPI's (names both values and the
// variable): a wrong local rank is how every process ends up on GPU 0.
void CheckLauncherAgrees(const LauncherVars& vars, int mpi_local_rank, int mpi_local_size);

std::string HostName();

// Rank 0 formats the table of every rank (host, local rank, device, threads) from the rows each
// rank contributes; collective.
std::string RankTable(Communicator& comm, const ProcessEnv& env, const std::string& device,
                      int threads);

}  // namespace dptrain
