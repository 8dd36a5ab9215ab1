// SPDX-License-Identifier: Apache-2.0
// The collective watchdog: no collective may block longer than dist.collective_timeout_s. Every
// blocking MPI call of the communicator runs inside a Watchdog::Scope; a monitor thread fires
// when a scope outlives the timeout, prints what was waited for, at which step, and (on rank 0)
// which ranks never arrived, runs the registered abort hooks (NCCL communicators) and calls
// MPI_Abort with exit code 5. Ranks report each collective they enter to rank 0 with a tiny
// eager message, so rank 0 knows who is missing even when a peer is stopped or dead.
#pragma once

#include <cstdint>
#include <functional>

namespace dptrain {

class Watchdog {
 public:
  // Starts the monitor (once per process, after MPI_Init). timeout_s <= 0: no watchdog.
  // `can_use_mpi_from_thread`: MPI was initialised with MPI_THREAD_MULTIPLE, so the monitor may
  // receive arrival reports; without it the watchdog still fires but cannot name missing ranks.
  static void Start(double timeout_s, bool can_use_mpi_from_thread);
  // Stops the monitor (before MPI_Finalize). Safe if never started.
  static void Stop();
  static bool running();
  // The training step shown in timeout messages (-1 = setup).
  static void SetStep(int64_t step);
  // Called before MPI_Abort when the watchdog fires (e.g. ncclCommAbort). Not thread-safe with
  // respect to Start/Stop; register during setup.
  static void AddAbortHook(std::function<void()> hook);

  // RAII: one blocking collective. `what` must be a string literal.
  class Scope {
   public:
    explicit Scope(const char* what);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    bool active_;
  };
};

}  // namespace dptrain
