// SPDX-License-Identifier: Apache-2.0
// For multi-rank tests that train: run a config on the first `world` ranks of a communicator
// (the others only wait), and compare the parameters two runs end with.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/trainer.h"

namespace dptrain::testing {

// (name, values) of every parameter and buffer: TrainResult::final_params.
using NamedTensors = std::vector<std::pair<std::string, std::vector<float>>>;

struct RunOutcome {
  TrainResult result;  // final_params are kept
  int exit_code = 0;   // of an AgreedError; 0 when none
  std::string error;
  int64_t peak_bytes = 0;  // this rank's allocator peak during the run, above what was live before
};

struct RunOptions {
  // Rank 0 resumes from / initialises with / writes checkpoints in cfg.run_dir (quietly);
  // otherwise the run touches no file.
  bool checkpoints = false;
  int64_t stop_at_step = -1;  // >= 0: stop there as a preemption signal would
  // >= 0: an infinity in the first gradient of rank inf_grad_rank before that optimizer step
  // (TrainHooks::inf_grad_step).
  int inf_grad_rank = -1;
  int64_t inf_grad_step = -1;
};

// Trains `cfg` quietly on the CPU backend (1 thread per rank) over ranks [0, world) of `comm`;
// the other ranks return an empty outcome. Collective over `comm`: every rank calls it.
RunOutcome TrainOnFirstRanks(MpiCommunicator& comm, int world, const TrainConfig& cfg,
                             const RunOptions& options = {});

// Worst relative L2 difference between same-named tensors of a and b (1 when the counts
// differ or there are none); `where` gets the name of the worst tensor.
double WorstRelative(const NamedTensors& a, const NamedTensors& b, std::string* where);

}  // namespace dptrain::testing
