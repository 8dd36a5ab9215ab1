// SPDX-License-Identifier: Apache-2.0
// The MPI implementation of both seams (ControlPlane; Communicator on host memory) and the
// process-wide MPI session.
// This header hides every MPI type so the trainer never includes <mpi.h>.
#pragma once

#include <memory>
#include <string>

#include "runtime/comm/communicator.h"

namespace dptrain {

// Initialises MPI (thread level MULTIPLE when available: the collective watchdog's thread talks
// to rank 0) and finalises it on destruction (stopping the watchdog first). A process run
// without mpirun becomes a world of one (MPI singleton).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  // A communicator over MPI_COMM_WORLD (a duplicate, so user traffic never mixes with ours).
  std::unique_ptr<MpiCommunicator> World();
  // MPI_Comm_split_type(SHARED): this process's rank and the size of its node-local group.
  void LocalRankAndSize(int* local_rank, int* local_size) const;
  static bool Initialized();
  // MPI_Abort(MPI_COMM_WORLD, code) when MPI is up; never returns.
  [[noreturn]] static void Abort(int code);
  static std::string LibraryVersion();
  bool thread_multiple() const { return thread_multiple_; }

 private:
  bool thread_multiple_ = false;
};

}  // namespace dptrain
