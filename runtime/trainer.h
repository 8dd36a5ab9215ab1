// SPDX-License-Identifier: Apache-2.0
// The training loop of DESIGN.md section 1 on every rank: data (sampler + loader threads),
// forward, loss, backward with overlapped gradient reduction, optimizer step, distributed
// evaluation, metrics, checkpoints (resume, periodic saves, preemption signals). Sees only the
// Backend, Communicator and Dataset seams.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "runtime/agreement.h"  // AgreedError, RunAgreed: what Train's callers catch and use
#include "runtime/comm/communicator.h"
#include "runtime/run_config.h"
#include "runtime/signals.h"  // InstallStopSignalHandlers
#include "runtime/train_hooks.h"

namespace dptrain {

// Everything the launcher discovered about this process.
struct TrainEnv {
  ControlPlane* control = nullptr;  // agreements between ranks: MPI
  Communicator* comm = nullptr;     // gradients and parameter broadcasts: MPI or NCCL
  Backend* backend = nullptr;
  int local_rank = 0;
  int local_size = 1;
  int threads = 1;  // compute threads of this rank
  std::string host;
  std::string resolved_toml;  // the resolved config, written to run_dir/config.toml
  bool interactive = false;   // rank 0's stdout is a terminal: live progress line
  TrainHooks hooks;           // tests only (runtime/train_hooks.h); default: no effect
};

struct TrainResult {
  int64_t steps = 0;
  int64_t epochs = 0;                 // completed epochs
  double last_loss = 0;               // mean training loss over the last logging window
  std::vector<double> logged_losses;  // every logging window's loss, in order (every rank)
  double test_loss = -1;              // last evaluation; -1 when none ran
  double test_accuracy = -1;
  double samples_per_s = 0;  // global, over the whole run
  // With TrainHooks::keep_final_params: (name, values) of every parameter and of every buffer
  // (batch-norm running statistics) after the last step.
  std::vector<std::pair<std::string, std::vector<float>>> final_params;
  std::vector<std::pair<std::string, std::vector<float>>> final_buffers;
  int64_t resumed_from_step = -1;  // the checkpoint's step when the run resumed, else -1
  // The preemption signal (SIGTERM, SIGUSR1) that stopped training early, 0 when it ran to the
  // end. Every rank stopped after the same step and rank 0 wrote a checkpoint there.
  int stop_signal = 0;
  std::string last_checkpoint;  // rank 0: the last checkpoint written by this run ("" if none)
};

// Trains per `cfg`. Every rank calls it; rank 0 prints and writes run_dir outputs. Throws typed
// errors; errors every rank detects during setup are agreed on first (AgreedError).
//
// Checkpoints (docs/checkpoints.md): before training, rank 0 resumes from checkpoint.resume
// ("auto": the newest valid run_dir/checkpoints/ckpt-*.h5; a path; "never") or initialises the
// parameters from checkpoint.init, and broadcasts what it loaded; a bad file is a CheckpointError
// (exit 6) on every rank. Rank 0 writes checkpoints every checkpoint.every_steps steps, every
// checkpoint.every_epochs epochs, at the end and on preemption, from a host copy in a background
// thread (the other ranks never wait for its disk; the end of Train does). Installs the stop
// signal handlers (InstallStopSignalHandlers).
TrainResult Train(const TrainConfig& cfg, const TrainEnv& env);

struct EvalResult {
  double test_loss = -1;
  double test_accuracy = -1;  // -1 for regression models
  int64_t samples = 0;        // test samples, summed over ranks (each counted once)
  int64_t step = -1;          // the checkpoint's step (-1 for a parameters-only file)
  // Classification: accuracy per class (-1 for a class without test samples), and the class
  // names from the test set's class_names (empty when it has none).
  std::vector<double> class_accuracy;
  std::vector<std::string> class_names;
};

// `dptrain eval`: loads the parameters and buffers of `checkpoint` (rank 0 reads and checks it,
// every rank receives it) and evaluates them on cfg.data.test, split exactly once over the
// ranks; rank 0 prints the result. Throws ConfigError without data.test, CheckpointError for a
// bad or mismatching checkpoint (agreed: every rank throws AgreedError with exit code 6).
EvalResult EvaluateCheckpoint(const TrainConfig& cfg, const TrainEnv& env,
                              const std::string& checkpoint);

}  // namespace dptrain
