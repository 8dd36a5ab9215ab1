// SPDX-License-Identifier: Apache-2.0
// The device binding decision, pure: device lists parsed and checked, the device each local rank
// takes, the request built from config, environment and inventory, and the descriptions of it.
#include "launcher/binding_policy.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/util/strings.h"

namespace dptrain {
namespace {

enum class EntryKind { kIndex, kUuid, kMig, kHide, kBad };

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
}

EntryKind Classify(std::string_view e) {
  if (IsDigits(e)) return e.size() <= 6 ? EntryKind::kIndex : EntryKind::kBad;
  if (e.size() > 1 && e[0] == '-' && IsDigits(e.substr(1))) return EntryKind::kHide;
  auto tail_ok = [](std::string_view t, bool slashes) {
    return !t.empty() && std::all_of(t.begin(), t.end(), [&](char c) {
      return std::isxdigit(static_cast<unsigned char>(c)) || c == '-' ||
             (slashes && (std::isalnum(static_cast<unsigned char>(c)) || c == '/'));
    });
  };
  if (e.substr(0, 4) == "GPU-" && tail_ok(e.substr(4), false)) return EntryKind::kUuid;
  // MIG-<uuid> (CUDA 11.4+) or the older MIG-GPU-<uuid>/<gi>/<ci>.
  if (e.substr(0, 4) == "MIG-" && tail_ok(e.substr(4), true)) return EntryKind::kMig;
  return EntryKind::kBad;
}

// Splits and validates a device list. `what` names it in messages ("CUDA_VISIBLE_DEVICES='0,1'").
std::vector<std::string> ParseList(const std::string& text, const std::string& what,
                                   bool allow_hide) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string e = Trim(std::string_view(text).substr(
        start, comma == std::string::npos ? std::string::npos : comma - start));
    if (e.empty()) {
      DPT_THROW(ConfigError) << what << ": empty entry (expected a comma-separated list such as "
                             << "0,1 or GPU-<uuid>,GPU-<uuid>)";
    }
    switch (Classify(e)) {
      case EntryKind::kBad:
        DPT_THROW(ConfigError) << what << ": entry '" << e
                               << "' is neither a GPU index (0, 1, ...), a GPU UUID (GPU-...) "
                               << "nor a MIG id (MIG-...); nvidia-smi -L lists them";
      case EntryKind::kHide:
        if (!allow_hide || !out.empty()) {
          DPT_THROW(ConfigError) << what << ": entry '" << e << "' is not a device"
                                 << (allow_hide ? " (CUDA ignores every entry after it)" : "");
        }
        break;
      default:
        break;
    }
    if (std::find(out.begin(), out.end(), e) != out.end()) {
      DPT_THROW(ConfigError) << what << ": '" << e << "' is listed twice";
    }
    out.push_back(e);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void CheckIndexExists(const std::string& e, const BindingRequest& r, const std::string& what) {
  if (Classify(e) != EntryKind::kIndex || !r.device_count) return;
  const int idx = std::atoi(e.c_str());
  if (idx >= *r.device_count) {
    DPT_THROW(ConfigError) << what << ": GPU " << idx << " does not exist: this host has "
                           << *r.device_count << " GPU" << (*r.device_count == 1 ? "" : "s")
                           << (*r.device_count > 0
                                   ? " (0-" + std::to_string(*r.device_count - 1) + ")"
                                   : std::string())
                           << "; nvidia-smi -L lists them";
  }
}

bool Truthy(const char* v) {
  if (v == nullptr) return false;
  std::string s = Trim(v);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

// An error's message without the "[rank 0/1] file.cc:12: " prefix (info prints for one process).
std::string Bare(const Error& e) {
  std::string s = e.what();
  if (s.empty() || s[0] != '[') return s;
  const size_t tag = s.find("] ");
  const size_t where = tag == std::string::npos ? tag : s.find(": ", tag + 2);
  return where == std::string::npos ? s : s.substr(where + 2);
}

}  // namespace

const char* const kNoGpuSharing =
    "DPTRAIN_ALLOW_GPU_SHARING=1 cannot help on GPUs: gradients go over NCCL, which refuses two "
    "ranks on one GPU (ncclInvalidUsage, \"Duplicate GPU detected\"), and the MPI communicator "
    "reduces host memory only";

BindingPolicy ParseBindingPolicy(std::string_view text) {
  if (text == "remap") return BindingPolicy::kRemap;
  if (text == "set-device") return BindingPolicy::kSetDevice;
  DPT_THROW(ConfigError) << "dist.device_binding must be one of \"remap\", \"set-device\", got \""
                         << text << "\"";
}

bool VisibleDevicesHideAll(const std::optional<std::string>& v) {
  if (!v) return false;
  const std::string t = Trim(*v);
  if (t.empty()) return true;
  const std::string first = Trim(std::string_view(t).substr(0, t.find(',')));
  return Classify(first) == EntryKind::kHide;
}

std::string DeviceBinding::Describe() const {
  std::ostringstream os;
  os << entry << " (candidate " << slot << " of " << source << ")";
  if (set_visible) {
    os << ", CUDA_VISIBLE_DEVICES=" << *set_visible;
  } else {
    os << ", cudaSetDevice(" << cuda_ordinal << ")";
  }
  return os.str();
}

DeviceBinding ChooseDevice(const BindingRequest& r) {
  DPT_CHECK(r.local_rank >= 0 && r.local_size >= 0 &&
            (r.local_size == 0 || r.local_rank < r.local_size))
      << "local rank " << r.local_rank << " of " << r.local_size;
  DeviceBinding b;
  // `visible`: the process's CUDA device list as entries (CUDA ordinal = position), when set.
  std::vector<std::string> visible;
  const bool visible_set = r.cuda_visible_devices.has_value();
  const std::string visible_what =
      visible_set ? "CUDA_VISIBLE_DEVICES='" + *r.cuda_visible_devices + "'" : std::string();
  if (visible_set) {
    if (VisibleDevicesHideAll(r.cuda_visible_devices)) {
      DPT_THROW(ConfigError)
          << visible_what << " hides every GPU from this process, so it cannot use one; unset "
          << "it, ask the scheduler for GPUs (e.g. srun --gpus-per-task=1), or train on the CPU "
          << "with dist.device=cpu";
    }
    visible = ParseList(*r.cuda_visible_devices, visible_what, /*allow_hide=*/true);
    for (const auto& e : visible) CheckIndexExists(e, r, visible_what);
  }

  std::vector<int> ordinals;  // CUDA ordinal of each candidate in this process (-1: unknown)
  if (!r.gpus.empty()) {
    const std::string what = "dist.gpus='" + r.gpus + "'";
    const std::vector<std::string> wanted = ParseList(r.gpus, what, /*allow_hide=*/false);
    for (const auto& g : wanted) {
      if (visible_set) {
        if (Classify(g) == EntryKind::kIndex) {
          const size_t pos = static_cast<size_t>(std::atoi(g.c_str()));
          if (pos >= visible.size()) {
            DPT_THROW(ConfigError)
                << what << ": index " << g << " is out of range: " << visible_what << " makes "
                << visible.size() << " GPU" << (visible.size() == 1 ? "" : "s")
                << " visible, numbered 0-" << visible.size() - 1
                << " (with CUDA_VISIBLE_DEVICES set, dist.gpus indices are positions in it)";
          }
          b.candidates.push_back(visible[pos]);
          ordinals.push_back(static_cast<int>(pos));
        } else {
          const auto it = std::find(visible.begin(), visible.end(), g);
          if (it == visible.end()) {
            DPT_THROW(ConfigError) << what << ": " << g << " is not one of " << visible_what
                                   << "; with CUDA_VISIBLE_DEVICES set, give dist.gpus as "
                                   << "indices into it or as entries it contains";
          }
          b.candidates.push_back(g);
          ordinals.push_back(static_cast<int>(it - visible.begin()));
        }
      } else {
        CheckIndexExists(g, r, what);
        b.candidates.push_back(g);
        int ord = -1;
        if (Classify(g) == EntryKind::kIndex) {
          ord = std::atoi(g.c_str());
        } else {
          const auto it = std::find(r.device_uuids.begin(), r.device_uuids.end(), g);
          if (it != r.device_uuids.end()) ord = static_cast<int>(it - r.device_uuids.begin());
        }
        ordinals.push_back(ord);
      }
    }
    b.source = visible_set ? what + " within " + visible_what : what;
  } else if (visible_set) {
    b.candidates = visible;
    for (size_t i = 0; i < visible.size(); ++i) ordinals.push_back(static_cast<int>(i));
    b.source = visible_what;
  } else {
    if (!r.device_count) {
      DPT_THROW(ConfigError) << "cannot count this host's GPUs ("
                             << (r.device_count_why.empty() ? "NVML unavailable"
                                                            : r.device_count_why)
                             << "); set CUDA_VISIBLE_DEVICES or dist.gpus to name them, or train "
                             << "on the CPU with dist.device=cpu";
    }
    if (*r.device_count == 0) {
      DPT_THROW(ConfigError) << "no GPU found on this host (NVML counts 0); train on the CPU "
                             << "with dist.device=cpu";
    }
    for (int i = 0; i < *r.device_count; ++i) {
      b.candidates.push_back(std::to_string(i));
      ordinals.push_back(i);
    }
    b.source = "all " + std::to_string(*r.device_count) + " GPU" +
               (*r.device_count == 1 ? "" : "s") + " of this host";
  }

  const int n = static_cast<int>(b.candidates.size());
  const int ranks = r.local_size > 0 ? r.local_size : r.local_rank + 1;
  // srun narrowed CUDA_VISIBLE_DEVICES to this task's own GPUs (--gpus-per-task=N implies
  // --gpu-bind=per_task:N): the list has fewer entries than the step holds on this node. Without
  // SLURM_GPUS_ON_NODE, a list exactly --gpus-per-task long with several tasks on the node says the
  // same (with --gpu-bind=none every task would see all local_size * N of them).
  b.per_task =
      visible_set && r.gpus.empty() && n > 1 &&
      (r.slurm_gpus_on_node ? *r.slurm_gpus_on_node > n : r.slurm_gpus_per_task == n && ranks > 1);
  if (n == 1) {
    b.slot = 0;  // one visible device: every rank uses it (the uniqueness check catches sharing)
  } else if (b.per_task) {
    b.slot = 0;
    b.source = "this task's own " + visible_what + " (srun";
    if (r.slurm_gpus_per_task) b.source += " --gpus-per-task=" + std::to_string(n);
    b.source += ")";
    b.warning = "srun gave each task " + std::to_string(n) + " GPUs (" + visible_what +
                " on local rank " + std::to_string(r.local_rank) +
                "); dptrain runs one process per GPU and uses the first of each task's list, so " +
                std::to_string(n - 1) + " GPU" + (n == 2 ? "" : "s") +
                " per task stay idle. Ask for --gpus-per-task=1 and " + std::to_string(n) +
                " times the tasks to use them all";
  } else if (ranks > n) {
    // Two ranks on one GPU cannot train: every GPU run reduces gradients with NCCL (dist.backend
    // "mpi" is refused for GPU memory: the MPI communicator has no host staging), and NCCL
    // rejects two ranks of a communicator on one device ("Duplicate GPU detected",
    // ncclInvalidUsage). So no hint offers sharing, and DPTRAIN_ALLOW_GPU_SHARING is explained.
    DPT_THROW(ConfigError) << (r.local_size > 0
                                   ? "this host runs " + std::to_string(r.local_size) + " ranks"
                                   : "local rank " + std::to_string(r.local_rank) + " needs a GPU")
                           << " but only " << n << " GPUs are available (" << b.source << " = "
                           << Join(b.candidates, ",") << "); start at most " << n
                           << " ranks per host (mpirun --npernode " << n
                           << ", srun --ntasks-per-node=" << n
                           << "), or train on the CPU with dist.device=cpu"
                           << (r.allow_sharing ? "; " + std::string(kNoGpuSharing) : "");
  } else {
    b.slot = r.local_rank;
  }
  b.entry = b.candidates[static_cast<size_t>(b.slot)];

  if (r.policy == BindingPolicy::kRemap) {
    b.set_visible = b.entry;
    b.cuda_ordinal = 0;
  } else {
    b.cuda_ordinal = ordinals[static_cast<size_t>(b.slot)];
    if (b.cuda_ordinal < 0) {
      DPT_THROW(ConfigError) << "dist.device_binding=set-device cannot find the CUDA ordinal of "
                             << b.entry << " (" << b.source
                             << "): give dist.gpus as indices, or use dist.device_binding=remap";
    }
  }
  return b;
}

std::string FindSharedGpu(const std::vector<BoundDevice>& rows) {
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    const BoundDevice& d = rows[i];
    const std::string key = !d.uuid.empty() ? "uuid " + d.uuid : d.host + " bus " + d.pci_bus_id;
    if (d.uuid.empty() && d.pci_bus_id.empty()) continue;  // nothing to compare
    auto [it, fresh] = seen.emplace(key, i);
    if (fresh) continue;
    const BoundDevice& a = rows[it->second];
    std::ostringstream os;
    os << "ranks " << a.rank << " and " << d.rank << " are on the same GPU "
       << (d.uuid.empty() ? d.pci_bus_id : d.uuid) << " (" << d.name << ", host " << d.host
       << ", local ranks " << a.local_rank << " and " << d.local_rank << ", devices '" << a.entry
       << "' and '" << d.entry << "'); every rank needs its own GPU. Check CUDA_VISIBLE_DEVICES "
       << "and dist.gpus (dptrain info shows the binding each local rank gets), or start fewer "
       << "ranks per host";
    return os.str();
  }
  // Two MIG instances of one GPU are two CUDA devices, but NCCL (which carries every GPU run's
  // gradients) identifies a GPU by host and PCI bus id, which they share: ncclCommInitRank
  // refuses them ("Duplicate GPU detected", NCCL 2.28 as installed; MIG is not supported,
  // NVIDIA/nccl issue 1716). Say so before NCCL starts.
  std::map<std::string, size_t> mig;
  for (size_t i = 0; i < rows.size(); ++i) {
    const BoundDevice& d = rows[i];
    if (d.uuid.rfind("MIG-", 0) != 0 || d.pci_bus_id.empty()) continue;
    auto [it, fresh] = mig.emplace(d.host + " bus " + d.pci_bus_id, i);
    if (fresh) continue;
    const BoundDevice& a = rows[it->second];
    std::ostringstream os;
    os << "ranks " << a.rank << " and " << d.rank << " use two MIG instances of one GPU (" << a.uuid
       << " and " << d.uuid << ", bus id " << d.pci_bus_id << ", host " << d.host
       << "): NCCL, which reduces the gradients of a GPU run, identifies a GPU by its bus id and "
       << "refuses two ranks on one (\"Duplicate GPU detected\"; it does not support MIG "
       << "instances of one GPU in a communicator). Give each rank a MIG instance of a different "
       << "GPU or a whole GPU, or train with one rank on one instance";
    return os.str();
  }
  return "";
}

std::string FormatBindingTable(const std::vector<BoundDevice>& rows) {
  std::ostringstream os;
  os << "rank  host                 local  device      gpu                       uuid"
        "                                      bus id\n";
  for (const auto& d : rows) {
    char line[512];
    std::snprintf(line, sizeof line, "%-5d %-20s %-6d %-11s %-25s %-41s %s\n", d.rank,
                  d.host.c_str(), d.local_rank, d.entry.c_str(), d.name.c_str(), d.uuid.c_str(),
                  d.pci_bus_id.c_str());
    os << line;
  }
  return os.str();
}

bool AllowGpuSharing(const GetEnvFn& getenv) { return Truthy(getenv("DPTRAIN_ALLOW_GPU_SHARING")); }

BindingRequest MakeBindingRequest(const DistConfig& dist, int local_rank, int local_size,
                                  const GpuInventory& inventory, const GetEnvFn& getenv) {
  BindingRequest r;
  r.local_rank = local_rank;
  r.local_size = local_size;
  if (const char* v = getenv("CUDA_VISIBLE_DEVICES")) r.cuda_visible_devices = v;
  r.gpus = Trim(dist.gpus);
  r.policy = dist.device_binding;
  r.allow_sharing = AllowGpuSharing(getenv);
  const LauncherVars vars = ReadLauncherVars(getenv);
  r.slurm_gpus_on_node = vars.slurm_gpus_on_node;
  r.slurm_gpus_per_task = vars.slurm_gpus_per_task;
  if (inventory.available) {
    r.device_count = static_cast<int>(inventory.gpus.size());
    for (const auto& g : inventory.gpus) r.device_uuids.push_back(g.uuid);
  } else {
    r.device_count_why = inventory.why;
  }
  return r;
}

std::string ResolveDeviceKind(const std::string& configured, bool cuda_built,
                              const GpuInventory& inventory,
                              const std::optional<std::string>& cuda_visible_devices) {
  if (configured != "auto") return configured;
  const bool gpus = cuda_built && inventory.available && !inventory.gpus.empty() &&
                    !VisibleDevicesHideAll(cuda_visible_devices);
  return gpus ? "cuda" : "cpu";
}

std::string DescribeBindings(const DistConfig& dist, const GpuInventory& inventory,
                             const GetEnvFn& getenv, int local_size,
                             std::optional<int> own_local_rank) {
  std::ostringstream os;
  const char* visible = getenv("CUDA_VISIBLE_DEVICES");
  const char* order = getenv("CUDA_DEVICE_ORDER");
  // Streamed piece by piece: "'" + std::string(visible) + "'" trips GCC 12's false -Wrestrict
  // at -O3 (GCC bug 105329) once this function is compiled next to the inlined helpers above.
  os << "binding (dist.device_binding=" << ConfigName(dist.device_binding) << ", dist.gpus='"
     << dist.gpus << "', CUDA_VISIBLE_DEVICES=";
  if (visible != nullptr) {
    os << "'" << visible << "'";
  } else {
    os << "<unset>";
  }
  os << ", CUDA_DEVICE_ORDER=" << (order ? order : "<unset: PCI_BUS_ID will be set>")
     << (AllowGpuSharing(getenv)
             ? ", DPTRAIN_ALLOW_GPU_SHARING set: no effect, NCCL needs a GPU per rank"
             : "")
     << "):\n";
  try {
    int n = local_size;
    if (n <= 0)
      n = static_cast<int>(
          ChooseDevice(MakeBindingRequest(dist, 0, 0, inventory, getenv)).candidates.size());
    std::string warning;
    int first = 0, last = n - 1;
    if (own_local_rank && *own_local_rank < n &&
        ChooseDevice(MakeBindingRequest(dist, *own_local_rank, n, inventory, getenv)).per_task) {
      first = last = *own_local_rank;  // the list is this task's own: other tasks see theirs
    }
    for (int r = first; r <= last; ++r) {
      os << "  local rank " << r << " of " << n << ": ";
      try {
        const DeviceBinding b = ChooseDevice(MakeBindingRequest(dist, r, n, inventory, getenv));
        os << b.Describe() << "\n";
        if (warning.empty()) warning = b.warning;
      } catch (const Error& e) {
        os << "error: " << Bare(e) << "\n";
      }
    }
    if (!warning.empty()) os << "  warning: " << warning << "\n";
  } catch (const Error& e) {
    os << "  no GPU binding possible: " << Bare(e) << "\n";
  }
  return os.str();
}

}  // namespace dptrain
