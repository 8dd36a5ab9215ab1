// SPDX-License-Identifier: Apache-2.0
// RunAgreed's collective half: the ranks find the lowest failing rank, which broadcasts its
// message and exit code.
#include "runtime/agreement.h"

#include <cstdint>

namespace dptrain {

namespace detail {
void AgreeOnFailure(ControlPlane& comm, const std::string& msg, int code, bool failed) {
  int64_t first = failed ? comm.rank() : comm.size();
  comm.AllReduceHost(&first, 1, ReduceOp::kMin);
  if (first == comm.size()) return;
  // The lowest failing rank tells everyone what happened.
  int64_t c = code;
  comm.BroadcastHost(&c, sizeof c, static_cast<int>(first));
  int64_t len = static_cast<int64_t>(msg.size());
  comm.BroadcastHost(&len, sizeof len, static_cast<int>(first));
  std::string text(static_cast<size_t>(len), '\0');
  if (comm.rank() == first) text = msg;
  comm.BroadcastHost(text.data(), text.size(), static_cast<int>(first));
  throw AgreedError(text, static_cast<int>(c));
}
}  // namespace detail

}  // namespace dptrain
