// SPDX-License-Identifier: Apache-2.0
// Process environment discovery: the launcher's variables (strictly parsed), compute threads,
// host name and the rank table.
#include "launcher/process_env.h"

#include <sched.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace dptrain {
namespace {

// `value` as a non-negative integer (the whole text, no sign, no spaces); nullopt when it is
// anything else.
std::optional<int> TryParseInt(const char* value) {
  int v = -1;
  const char* end = value + std::char_traits<char>::length(value);
  auto [p, ec] = std::from_chars(value, end, v);
  if (ec != std::errc() || p != end || v < 0) return std::nullopt;
  return v;
}

// As TryParseInt, but unset is nullopt and malformed is a ConfigError naming the variable.
std::optional<int> ParseInt(const char* name, const char* value) {
  if (value == nullptr) return std::nullopt;
  const std::optional<int> v = TryParseInt(value);
  if (!v) {
    DPT_THROW(ConfigError) << "launcher environment: " << name << "='" << value
                           << "' is not a non-negative integer";
  }
  return v;
}

// The variables that carry the world rank, in precedence order.
constexpr const char* kWorldRankVars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                          "SLURM_PROCID"};

}  // namespace

GetEnvFn SystemGetEnv() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

LauncherVars ReadLauncherVars(const GetEnvFn& getenv) {
  struct Source {
    const char* rank;
    const char* size;
    const char* launcher;
  };
  static const Source kSources[] = {
      {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun (Open MPI)"},
      {"MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MPICH/Hydra"},
      {"MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE", "MVAPICH"},
      {"PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", "PMI"},
      {"SLURM_LOCALID", nullptr, "srun"},
  };
  LauncherVars v;
  for (const auto& s : kSources) {
    const char* r = getenv(s.rank);
    if (r == nullptr) continue;
    v.local_rank = ParseInt(s.rank, r);
    v.local_rank_source = s.rank;
    v.launcher = s.launcher;
    if (s.size != nullptr) v.local_size = ParseInt(s.size, getenv(s.size));
    break;
  }
  return v;
}

bool UnderLauncher(const GetEnvFn& getenv) {
  for (const char* v : kWorldRankVars) {
    if (getenv(v) != nullptr) return true;
  }
  return false;
}

bool IsWorldRankZeroByEnv(const GetEnvFn& getenv) {
  for (const char* v : kWorldRankVars) {
    if (const char* s = getenv(v)) return TryParseInt(s).value_or(0) == 0;
  }
  return true;
}

std::optional<LauncherRank> LauncherRankAndWorld(const GetEnvFn& getenv) {
  static const std::pair<const char*, const char*> kPairs[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"PMI_RANK", "PMI_SIZE"},
      {"PMIX_RANK", "PMIX_SIZE"},
      {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& [rank_var, size_var] : kPairs) {
    const char* r = getenv(rank_var);
    const char* n = getenv(size_var);
    if (r == nullptr || n == nullptr) continue;
    const std::optional<int> rank = TryParseInt(r);
    const std::optional<int> size = TryParseInt(n);
    if (rank && size && *size > 0) return LauncherRank{*rank, *size};
  }
  return std::nullopt;
}

int LauncherWorldSize(const GetEnvFn& getenv) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    if (const char* s = getenv(v)) {
      const std::optional<int> n = TryParseInt(s);
      if (n && *n > 0) return *n;
    }
  }
  return 1;
}

int ChooseThreads(int64_t configured, const char* omp_num_threads, int affinity_cores,
                  int online_cores, int local_size) {
  if (configured > 0) return static_cast<int>(configured);
  if (omp_num_threads != nullptr && *omp_num_threads != '\0') {
    const int n = std::atoi(omp_num_threads);
    if (n > 0) return n;
  }
  // A launcher that pins ranks (mpirun --bind-to socket, srun --cpu-bind) already gave this
  // process only its share of the cores: use them all. Otherwise share the node's cores.
  if (affinity_cores < online_cores) return std::max(1, affinity_cores);
  return std::max(1, affinity_cores / std::max(1, local_size));
}

int OnlineCores() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int AffinityCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

void CheckLauncherAgrees(const LauncherVars& vars, int mpi_local_rank, int mpi_local_size) {
  if (vars.local_rank && *vars.local_rank != mpi_local_rank) {
    DPT_THROW(ConfigError) << "launcher environment: " << vars.local_rank_source << "="
                           << *vars.local_rank << " but MPI says this process is local rank "
                           << mpi_local_rank << " of " << mpi_local_size
                           << " on this host; the environment does not belong to this launch "
                           << "(stale variables exported in a job script, or srun variables "
                           << "under a different launcher). Unset it or launch with one tool.";
  }
  if (vars.local_size && *vars.local_size != mpi_local_size) {
    DPT_THROW(ConfigError) << "launcher environment: the launcher says " << *vars.local_size
                           << " ranks on this host but MPI counts " << mpi_local_size;
  }
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string RankTable(ControlPlane& comm, const ProcessEnv& env, const std::string& device,
                      int threads) {
  std::ostringstream row;
  row << env.rank << "\t" << env.host << "\t" << env.local_rank << "/" << env.local_size << "\t"
      << device << "\t" << threads;
  const auto rows = comm.AllGatherStrings(row.str());
  if (comm.rank() != 0) return "";
  std::ostringstream os;
  os << "rank  host                 local  device        threads\n";
  for (const auto& r : rows) {
    std::istringstream is(r);
    std::string rank, host, local, dev, thr;
    std::getline(is, rank, '\t');
    std::getline(is, host, '\t');
    std::getline(is, local, '\t');
    std::getline(is, dev, '\t');
    std::getline(is, thr, '\t');
    char line[256];
    std::snprintf(line, sizeof line, "%-5s %-20s %-6s %-13s %s\n", rank.c_str(), host.c_str(),
                  local.c_str(), dev.c_str(), thr.c_str());
    os << line;
  }
  return os.str();
}

}  // namespace dptrain
