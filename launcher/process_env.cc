// SPDX-License-Identifier: Apache-2.0
// Process environment discovery: the launcher's variables (strictly parsed), compute threads,
// host name and the rank table.
#include "launcher/process_env.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <sstream>
#include <utility>
#include <vector>

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

// Slurm's compressed per-node counts, "2(x3),1" = 2,2,2,1 (srun(1), SLURM_TASKS_PER_NODE),
// expanded; nullopt when malformed.
std::optional<std::vector<int>> ExpandTasksPerNode(const std::string& text) {
  std::vector<int> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t paren = item.find("(x");
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') return std::nullopt;
      const std::optional<int> r =
          TryParseInt(item.substr(paren + 2, item.size() - paren - 3).c_str());
      if (!r || *r == 0) return std::nullopt;
      repeat = *r;
    }
    const std::optional<int> n = TryParseInt(item.substr(0, paren).c_str());
    if (!n || *n == 0 || out.size() + static_cast<size_t>(repeat) > 1000000) return std::nullopt;
    out.insert(out.end(), static_cast<size_t>(repeat), *n);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// This node's ranks under srun: its entry of the step's (else the job's) task counts, picked by
// SLURM_NODEID (the node's index in the step). nullopt when neither count variable is set, or
// when SLURM_NODEID is missing and the nodes do not all run the same count.
std::optional<int> SlurmLocalSize(const GetEnvFn& getenv, std::string* source) {
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const char* v = getenv(name);
    if (v == nullptr) continue;
    const std::optional<std::vector<int>> parsed = ExpandTasksPerNode(v);
    if (!parsed) {
      DPT_THROW(ConfigError) << "launcher environment: " << name << "='" << v
                             << "' is not a Slurm task count list like 4 or 2(x3),1";
    }
    const std::vector<int>& counts = *parsed;
    const std::optional<int> node = ParseInt("SLURM_NODEID", getenv("SLURM_NODEID"));
    *source = std::string(name) + "='" + v + "'";
    if (node) {
      if (static_cast<size_t>(*node) >= counts.size()) {
        DPT_THROW(ConfigError) << "launcher environment: SLURM_NODEID=" << *node << " but " << name
                               << "='" << v << "' lists " << counts.size() << " node"
                               << (counts.size() == 1 ? "" : "s");
      }
      return counts[static_cast<size_t>(*node)];
    }
    if (std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; })) {
      return counts[0];
    }
    source->clear();
    return std::nullopt;
  }
  return std::nullopt;
}

// A Slurm GPU count ("2", "a100:2", "a100:2,v100:1" summed); a ConfigError naming `name` when
// malformed.
int CountSlurmGpus(const char* name, const std::string& text) {
  int total = 0;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t colon = item.rfind(':');
    if (colon != std::string::npos) item = item.substr(colon + 1);
    const std::optional<int> n = TryParseInt(item.c_str());
    if (!n || *n == 0) {
      DPT_THROW(ConfigError) << "launcher environment: " << name << "='" << text
                             << "' is not a GPU count like 2 or a100:2";
    }
    total += *n;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return total;
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
    if (s.size != nullptr) {
      v.local_size = ParseInt(s.size, getenv(s.size));
      if (v.local_size) v.local_size_source = s.size;
    }
    break;
  }
  if (v.local_rank_source == "SLURM_LOCALID") {
    // Direct launch by srun. What this relies on (srun(1), "OUTPUT ENVIRONMENT VARIABLES"):
    // SLURM_STEP_TASKS_PER_NODE is the step's tasks per node and SLURM_NODEID this node's index
    // in it; SLURM_GPUS_ON_NODE is the number of GPUs available to the step on this node.
    // --gpus-per-task=N implies --gpu-bind=per_task:N, so each task's CUDA_VISIBLE_DEVICES then
    // holds only its own N GPUs, fewer than SLURM_GPUS_ON_NODE (--gpu-bind=none keeps the
    // step's whole list). SLURM_STEP_GPUS does not tell the two apart: Slurm narrows it per task
    // like CUDA_VISIBLE_DEVICES (seen on Slurm 22.05: task 0 "0,1", task 1 "2,3"), although
    // srun(1) calls it the step's GPUs. SLURM_GPUS_PER_TASK is srun's input variable for
    // --gpus-per-task (inherited from sbatch); it only backs up SLURM_GPUS_ON_NODE. None of this
    // is read under mpirun, whose ranks inherit the batch step's SLURM_* variables.
    v.local_size = SlurmLocalSize(getenv, &v.local_size_source);
    v.slurm_gpus_on_node = ParseInt("SLURM_GPUS_ON_NODE", getenv("SLURM_GPUS_ON_NODE"));
    if (const char* g = getenv("SLURM_GPUS_PER_TASK")) {
      v.slurm_gpus_per_task = CountSlurmGpus("SLURM_GPUS_PER_TASK", g);
    }
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
  // Another rank prints only when a launcher's complete (rank, size) pair says this is rank r of
  // a world larger than r: a rank left exported in a shell without its size (or inside a Slurm
  // allocation, whose SLURM_PROCID/SLURM_NTASKS say 0 of N) belongs to a process that prints.
  const std::optional<LauncherRank> r = LauncherRankAndWorld(getenv);
  return !(r && r->rank > 0 && r->rank < r->world);
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
    // OpenMP reads a list of positive integers, one per nesting level; the first is ours. An
    // empty value counts as unset, as for OpenMP runtimes.
    const std::string text = omp_num_threads;
    std::optional<int> first;
    for (size_t start = 0;;) {
      const size_t comma = text.find(',', start);
      const std::optional<int> n = TryParseInt(
          text.substr(start, comma == std::string::npos ? std::string::npos : comma - start)
              .c_str());
      if (!n || *n == 0) {
        DPT_THROW(ConfigError) << "OMP_NUM_THREADS='" << text << "' is not a positive integer "
                               << "(or a list like 8,4); fix or unset it, or set dist.threads";
      }
      if (!first) first = n;
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return *first;
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
                           << " ranks on this host but MPI counts " << mpi_local_size << " ("
                           << vars.local_size_source << ")";
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
