// SPDX-License-Identifier: Apache-2.0
// Deadlines enforced from a thread of their own. A collective in flight on a device (an NCCL
// kernel) is not bounded by the thread that polls it: when a peer dies, the main thread may be
// blocked in a CUDA call that waits for the whole device (cudaFree, cudaDeviceSynchronize,
// cudaFreeHost) rather than in the poll. The monitor runs each operation's expiry action (the
// NCCL communicator's ncclCommAbort, whose kernels then exit, so the blocked call returns) once
// its deadline passes, whatever the main thread is doing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace dptrain {

class DeadlineMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;

  DeadlineMonitor() = default;
  ~DeadlineMonitor();  // stops the thread; actions not yet due never run
  DeadlineMonitor(const DeadlineMonitor&) = delete;
  DeadlineMonitor& operator=(const DeadlineMonitor&) = delete;

  // Runs `on_expiry` once, on the monitor's thread, when `deadline` passes before Done(id).
  // The action must not throw and must not call back into the monitor.
  Id Watch(Clock::time_point deadline, std::function<void()> on_expiry);
  // The operation finished: its action will not run (it may be running right now; Done does
  // not wait for it).
  void Done(Id id);
  size_t in_flight() const;
  int64_t expired() const;  // actions run so far

  // The process's monitor (the NCCL communicators' handles share it).
  static DeadlineMonitor& Shared();

 private:
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, std::pair<Id, std::function<void()>>> due_;
  Id next_id_ = 1;
  int64_t expired_ = 0;
  bool stop_ = false;
  std::thread thread_;  // started by the first Watch
};

// Runs `fn` on a thread of its own and waits at most `seconds` for it. True when it returned in
// time; false when it did not, in which case the thread is left running (detached) and the
// caller goes on: for a last action before exiting that must not hold the exit up (ncclCommAbort
// before MPI_Abort can block in network teardown). `fn` must not throw.
bool CallWithDeadline(std::function<void()> fn, double seconds) noexcept;

}  // namespace dptrain
