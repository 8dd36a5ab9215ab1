// SPDX-License-Identifier: Apache-2.0
// Who this process is: rank and world from MPI, local rank and local size from
// MPI_Comm_split_type(SHARED), cross-checked against the launcher's environment variables (read
// before MPI_Init, before any CUDA call), host name, and compute threads. The one place that
// reads the launcher's variables (OMPI_*, PMI_*, PMIX_*, SLURM_*, MPI_LOCAL*, MV2_*).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "runtime/comm/communicator.h"

namespace dptrain {

// Environment access, injectable for tests; SystemGetEnv() is std::getenv.
using GetEnvFn = std::function<const char*(const char*)>;
GetEnvFn SystemGetEnv();

// What the launcher told us through the environment. Pure: `getenv` is injected for tests.
struct LauncherVars {
  std::optional<int> local_rank;
  std::optional<int> local_size;
  std::string local_rank_source;  // the variable local_rank came from, e.g.
                                  // "OMPI_COMM_WORLD_LOCAL_RANK"; empty when none
  std::string local_size_source;  // e.g. "SLURM_STEP_TASKS_PER_NODE='4(x2)'"; empty when none
  std::string launcher;           // "mpirun (Open MPI)", "MPICH/Hydra", "MVAPICH", "srun", ""
  // Only under srun (local rank from SLURM_LOCALID): how Slurm handed GPUs to this job step.
  std::optional<int> slurm_gpus_on_node;   // SLURM_GPUS_ON_NODE: the step's GPUs on this node
  std::optional<int> slurm_gpus_per_task;  // SLURM_GPUS_PER_TASK ("2", "a100:2"), summed
};
// Precedence (DESIGN.md section 4): OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// MV2_COMM_WORLD_LOCAL_RANK, PMI_LOCAL_RANK; SLURM_LOCALID only when none of those exists
// (under mpirun inside an allocation it is 0 on every rank). Under srun the local size is this
// node's entry of SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE), "2(x3),1" style, picked
// by SLURM_NODEID; unknown when SLURM_NODEID is missing and the nodes differ. Malformed values ->
// ConfigError naming the variable.
LauncherVars ReadLauncherVars(const GetEnvFn& getenv);

// ---- world rank and size before MPI_Init ------------------------------------------------------
// MPI's answer replaces these as soon as it is up. None of them throws: a value that is not a
// non-negative integer counts as absent.

// Started by mpirun, srun or another PMI launcher (as opposed to a plain single process): one of
// OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, SLURM_PROCID is set, whatever its value.
bool UnderLauncher(const GetEnvFn& getenv);

// Whether this process prints the errors found before MPI_Init: false only when
// LauncherRankAndWorld (below) finds a pair saying rank r of a world larger than r, r > 0. A
// single process, malformed values, and a rank left exported in a shell without its size (or
// beyond it) print: an error printed twice beats an error printed by no rank.
bool IsWorldRankZeroByEnv(const GetEnvFn& getenv);

struct LauncherRank {
  int rank = 0;
  int world = 1;
};
// Rank and world from the first pair (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), (PMI_RANK,
// PMI_SIZE), (PMIX_RANK, PMIX_SIZE), (SLURM_PROCID, SLURM_NTASKS) whose two values are
// well-formed and whose size is > 0; nullopt when there is none.
std::optional<LauncherRank> LauncherRankAndWorld(const GetEnvFn& getenv);

// The job's world size from the first of OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS that is a
// well-formed integer > 0; 1 when there is none (a single process).
int LauncherWorldSize(const GetEnvFn& getenv);

// Compute threads for this rank: dist.threads when > 0; else OMP_NUM_THREADS when set (a
// positive integer, optionally a list "8,4" of which the first level counts, as OpenMP reads it;
// anything else is a ConfigError naming the variable); else,
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
std::string RankTable(ControlPlane& comm, const ProcessEnv& env, const std::string& device,
                      int threads);

}  // namespace dptrain
