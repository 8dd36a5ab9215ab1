// SPDX-License-Identifier: Apache-2.0
// Training runs for multi-rank tests (train_runs.h): a config run on the first `world` ranks
// while the others wait, and the comparison of the parameters two runs end with.
#include "tests/testing/train_runs.h"

#include <algorithm>
#include <cmath>

#include "core/backend_registry.h"
#include "core/memory/caching_allocator.h"

namespace dptrain::testing {

RunOutcome TrainOnFirstRanks(MpiCommunicator& comm, int world, const TrainConfig& cfg,
                             const RunOptions& options) {
  auto sub = comm.SplitMpi(comm.rank() < world ? 0 : -1);
  RunOutcome out;
  if (sub) {
    TrainEnv env;
    env.control = sub.get();
    env.comm = sub.get();
    env.backend = &GetBackend("cpu");
    env.threads = 1;
    env.hooks.keep_final_params = true;
    env.hooks.quiet = true;
    env.hooks.quiet_checkpoints = options.checkpoints;
    env.hooks.stop_at_step = options.stop_at_step;
    env.hooks.inf_grad_rank = options.inf_grad_rank;
    env.hooks.inf_grad_step = options.inf_grad_step;
    CachingAllocator& alloc = env.backend->allocator();
    const auto before = static_cast<int64_t>(alloc.stats().in_use);
    alloc.ResetPeak();
    try {
      out.result = Train(cfg, env);
      out.peak_bytes = static_cast<int64_t>(alloc.stats().peak_in_use) - before;
    } catch (const AgreedError& e) {
      out.exit_code = e.exit_code();
      out.error = e.what();
    }
  }
  comm.Barrier();
  return out;
}

double WorstRelative(const NamedTensors& a, const NamedTensors& b, std::string* where) {
  // No tensors at all is a failure too (a run that did not train, or ran on other ranks).
  double worst = a.size() == b.size() && !a.empty() ? 0 : 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double diff = 0, norm = 0;
    for (size_t j = 0; j < a[i].second.size(); ++j) {
      const double d = a[i].second[j] - b[i].second[j];
      diff += d * d;
      norm += static_cast<double>(b[i].second[j]) * b[i].second[j];
    }
    const double rel = std::sqrt(diff / std::max(norm, 1e-30));
    if (rel > worst) {
      worst = rel;
      *where = a[i].first;
    }
  }
  return worst;
}

}  // namespace dptrain::testing
