// SPDX-License-Identifier: Apache-2.0
// `dptrain train` and `dptrain eval`: start MPI, bind each rank to its device, agree on the
// configuration and run the trainer (or evaluate a checkpoint) on every rank.
#pragma once

#include <string>
#include <vector>

#include "runtime/train_hooks.h"

namespace dptrain {

struct RunArgs {
  std::string config_path;
  std::vector<std::string> sets;  // --set items, in order
  bool eval = false;
  std::string checkpoint;     // eval: the checkpoint to evaluate
  int requeue_exit_code = 0;  // train: exit code after a preemption signal
  TrainHooks hooks;           // tests only
};

// Collective under a launcher. Returns the process's exit code; `argc` / `argv` go to MPI_Init.
// An error on every rank alike is printed once (rank 0) and returned; an error on some ranks only
// is printed by the failing rank and ends the job with MPI_Abort (this never returns then).
int RunTrainOrEval(const RunArgs& args, int* argc, char*** argv);

}  // namespace dptrain
