// SPDX-License-Identifier: Apache-2.0
// For multi-rank tests (run under mpiexec by ctest, main in tests/testing/mpi_main.cc): the
// world communicator and the "agree on the verdict first" helper of STYLE.md section 6.
#pragma once

#include <string>

#include "runtime/comm/communicator.h"

namespace dptrain::testing {

// The world communicator of the test process (valid inside tests).
MpiCommunicator& WorldComm();

// True on every rank iff `ok` on every rank. Call on all ranks before asserting, so no rank
// returns early while another waits in a collective.
inline bool AllRanksOk(ControlPlane& comm, bool ok) { return comm.AllTrue(ok); }

}  // namespace dptrain::testing
