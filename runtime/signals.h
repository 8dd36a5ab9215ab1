// SPDX-License-Identifier: Apache-2.0
// Preemption signals (SIGTERM, SIGUSR1): a flag set by a dedicated sigwait thread, read by the
// trainer at step boundaries, where the ranks agree to stop after the same step.
#pragma once

#include <string>

namespace dptrain {

// Takes over SIGTERM and SIGUSR1: they only set a flag. They are blocked in the calling thread
// (and so in every thread it creates later) and received by a dedicated thread with sigwait; a
// handler that only sets the flag catches them in threads created earlier. Call it first thing
// in main, before MPI_Init and before any other thread exists. At each step boundary the ranks
// agree (one small allreduce) on whether any rank saw a signal; if so, all stop after the same
// step, rank 0 writes a checkpoint and Train returns with TrainResult::stop_signal set. Further
// signals change nothing (a write in progress completes). Idempotent; Train calls it too; from
// then on these signals never terminate the process.
void InstallStopSignalHandlers();

// The first stop signal received since the last ClearStopSignals (0: none).
int PendingStopSignal();
// How many stop signals arrived since the last ClearStopSignals.
int StopSignalCount();
// The signal is consumed: a later Train in this process starts clean.
void ClearStopSignals();
// "SIGTERM", "SIGUSR1", else "signal N".
std::string SignalName(int sig);

}  // namespace dptrain
