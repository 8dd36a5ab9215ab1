// SPDX-License-Identifier: Apache-2.0
// The stop-signal flag and the thread that sets it.
#include "runtime/signals.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <thread>

namespace dptrain {
namespace {

// Set when a stop signal arrives (by the sigwait thread, or the fallback handler: lock-free
// atomics are async-signal-safe); read at step boundaries.
std::atomic<int> g_stop_signal{0};
std::atomic<int> g_signal_count{0};
static_assert(std::atomic<int>::is_always_lock_free);

void OnStopSignal(int sig) {
  g_stop_signal.store(sig);
  g_signal_count.fetch_add(1);
}

}  // namespace

std::string SignalName(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGUSR1) return "SIGUSR1";
  return "signal " + std::to_string(sig);
}

int PendingStopSignal() { return g_stop_signal.load(); }

int StopSignalCount() { return g_signal_count.load(); }

void ClearStopSignals() {
  g_stop_signal.store(0);
  g_signal_count.store(0);
}

void InstallStopSignalHandlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  // Fallback: a thread created before this call (MPI's progress threads when it runs after
  // MPI_Init) may still take a signal; the handler only sets the flag.
  struct sigaction sa {};
  sa.sa_handler = &OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (reads, MPI's polling) resume after the handler
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  // The signals are blocked in this thread and so in every thread it creates from now on
  // (OpenMP, oneDNN, loader, checkpoint writer) and taken synchronously by one thread that does
  // nothing else: a signal never interrupts a compute kernel or a library call. (Delivered
  // asynchronously under mpirun, a forwarded SIGUSR1 occasionally corrupted oneDNN's heap.)
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) OnStopSignal(sig);
    }
  }).detach();
}

}  // namespace dptrain
