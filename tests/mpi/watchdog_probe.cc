// SPDX-License-Identifier: Apache-2.0
// A job that hangs on purpose: rank `argv[1]` sleeps through a barrier that every other rank
// enters. Run by watchdog_test.sh, which expects the watchdog to fire within its timeout, name
// the missing rank, and end the whole job with exit code 5.
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/watchdog.h"

int main(int argc, char** argv) {
  using namespace dptrain;
  MpiSession mpi(&argc, &argv);
  auto world = mpi.World();
  SetProcessContext({world->rank(), world->size(), "probe"});
  const int hang_rank = argc > 1 ? std::atoi(argv[1]) : 1;
  const double timeout = argc > 2 ? std::atof(argv[2]) : 2.0;
  Watchdog::Start(timeout, mpi.thread_multiple());
  for (int step = 0; step < 3; ++step) {
    Watchdog::SetStep(step);
    world->Barrier();
  }
  Watchdog::SetStep(3);
  const bool inside = argc > 3 && std::string(argv[3]) == "inside";
  if (world->rank() == hang_rank) {
    if (inside) {
      // Stopped inside the collective: it reported arriving, then everything stops (its
      // monitor thread's heartbeats too), as a SIGSTOP in the middle of an allreduce does.
      Watchdog::Scope scope("barrier");
      // Its arrival report may still wait in this process's send queue (Open MPI moves it on
      // in the next MPI call): let the monitor thread's heartbeat (every second) push it out
      // first, so that rank 0 knows it arrived (seen under ThreadSanitizer's slowness).
      sleep(2);
      raise(SIGSTOP);
    }
    sleep(60);  // a stuck rank before the collective (as if SIGSTOPped)
  }
  world->Barrier();
  return 0;
}
