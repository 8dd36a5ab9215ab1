// SPDX-License-Identifier: Apache-2.0
// Communicator helpers shared by implementations.
#include "runtime/comm/communicator.h"

namespace dptrain {

bool ControlPlane::AllTrue(bool ok) {
  int64_t v = ok ? 1 : 0;
  AllReduceHost(&v, 1, ReduceOp::kMin);
  return v == 1;
}

}  // namespace dptrain
