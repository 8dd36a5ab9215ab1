// SPDX-License-Identifier: Apache-2.0
// The training loop of DESIGN.md section 1 on every rank: data (sampler + loader threads),
// forward, loss, backward with overlapped gradient reduction, optimizer step, distributed
// evaluation, metrics. Sees only the Backend, Communicator and Dataset seams.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "launcher/config.h"
#include "runtime/backend.h"
#include "runtime/comm/communicator.h"
#include "runtime/error.h"

namespace dptrain {

// Everything the launcher discovered about this process.
struct TrainEnv {
  Communicator* comm = nullptr;  // control plane and gradients (MPI)
  Backend* backend = nullptr;
  int local_rank = 0;
  int local_size = 1;
  int threads = 1;  // compute threads of this rank
  std::string host;
  std::string resolved_toml;       // the resolved config, written to run_dir/config.toml
  bool interactive = false;        // rank 0's stdout is a terminal: live progress line
  bool keep_final_params = false;  // tests: return the final parameters in TrainResult
  bool quiet = false;              // no output and no run_dir files (tests)
};

struct TrainResult {
  int64_t steps = 0;
  int64_t epochs = 0;     // completed epochs
  double last_loss = 0;   // mean training loss over the last logging window
  double test_loss = -1;  // last evaluation; -1 when none ran
  double test_accuracy = -1;
  double samples_per_s = 0;  // global, over the whole run
  // With TrainEnv::keep_final_params: (name, values) of every parameter after the last step.
  std::vector<std::pair<std::string, std::vector<float>>> final_params;
};

// Trains per `cfg`. Every rank calls it; rank 0 prints and writes run_dir outputs. Throws typed
// errors; errors every rank detects during setup are agreed on first (AgreedError).
TrainResult Train(const TrainConfig& cfg, const TrainEnv& env);

// An error that every rank has agreed on: all ranks throw it, only rank 0 should print it, and
// the process can exit with its code without MPI_Abort.
class AgreedError : public Error {
 public:
  AgreedError(const std::string& msg, int code) : Error(msg, code) {}
};

// Runs fn on every rank; if it throws on any rank, every rank throws AgreedError carrying the
// message and exit code of the lowest failing rank. fn must not call collectives.
template <class F>
void RunAgreed(Communicator& comm, F&& fn);

namespace detail {
void AgreeOnFailure(Communicator& comm, const std::string& msg, int code, bool failed);
}

template <class F>
void RunAgreed(Communicator& comm, F&& fn) {
  std::string msg;
  int code = 0;
  bool failed = false;
  try {
    fn();
  } catch (const Error& e) {
    msg = e.what();
    code = e.exit_code();
    failed = true;
  } catch (const std::exception& e) {
    msg = e.what();
    code = kExitInternal;
    failed = true;
  }
  detail::AgreeOnFailure(comm, msg, code, failed);
}

}  // namespace dptrain
