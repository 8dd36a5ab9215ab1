// SPDX-License-Identifier: Apache-2.0
// Replica divergence check.
#include "runtime/comm/replica_check.h"

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace dptrain {

uint64_t TensorChecksum(Backend& be, const Tensor& t) {
  std::vector<unsigned char> host(t.bytes());
  be.CopyToHost(t, host.data());
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : host) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void CheckReplicasIdentical(ControlPlane& comm, Backend& be, const Tensor& params, int64_t step) {
  const uint64_t mine = TensorChecksum(be, params);
  const auto all = comm.AllGatherStrings(std::to_string(mine));
  std::map<std::string, std::vector<int>> groups;
  for (int r = 0; r < static_cast<int>(all.size()); ++r)
    groups[all[static_cast<size_t>(r)]].push_back(r);
  if (groups.size() <= 1) return;
  std::ostringstream os;
  os << "the model replicas diverged at step " << step << ": ";
  bool first = true;
  for (const auto& [sum, ranks] : groups) {
    os << (first ? "" : "; ") << "ranks";
    for (int r : ranks) os << " " << r;
    os << " hold checksum " << std::hex << std::stoull(sum) << std::dec;
    first = false;
  }
  os << ". Every rank applies the same averaged update to the same initial parameters, so this "
        "is a bug, silent memory corruption or a faulty device; please report it with the "
        "config. (dist.check_replicas_every sets how often this is checked.)";
  throw InternalError(RankTag() + os.str());
}

}  // namespace dptrain
