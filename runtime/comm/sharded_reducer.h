// SPDX-License-Identifier: Apache-2.0
// The gradient reducer for sharded data parallelism (dist.shard, ZeRO stages 1 and 2): each
// group of the model's flat layout (models/model.h FlatLayout) is reduce-scattered as soon as
// backward has made it final, so rank r ends the step with the summed gradients of its chunks
// only; after the optimizer stepped those chunks, the updated parameters are all-gathered.
//   optimizer  the flat gradient buffer stays; only the rank's chunks hold sums afterwards.
//   gradients  there is no flat gradient buffer: a group's gradients live in a scratch buffer
//              from the first backward that writes them until their reduce-scatter completes;
//              the rank keeps its reduced chunks in a shard-sized buffer (accumulated over
//              micro-steps), so every micro-step's backward communicates. At most two
//              groups have scratch at once (the one being written, the one being reduced),
//              and only while they fit in what the mode saves; where one group alone does not,
//              the mode would peak above "optimizer" and runs as "optimizer" (mode() says so).
//              models/memory_plan.h ShardedGradScratchFloats is the rule.
#pragma once

#include <memory>
#include <vector>

#include "models/memory_plan.h"
#include "models/model.h"
#include "runtime/comm/communicator.h"
#include "runtime/optim/shard_layout.h"

namespace dptrain {

class ShardedReducer {
 public:
  // `model` was set up with ShardedFlatLayout(mode, ...) below.
  ShardedReducer(Backend& be, Communicator& comm, Model& model, ShardMode mode);
  ~ShardedReducer();

  const ShardLayout& layout() const { return layout_; }
  // As it runs: kOptimizer for a "gradients" request that would peak above "optimizer".
  ShardMode mode() const { return mode_; }

  // Call before a backward whose gradients are to be reduced; `accumulate`: add to the reduced
  // gradients of earlier micro-steps of this step (gradients mode only).
  void Begin(bool accumulate);
  // Before top-level child c's backward (gradients mode: gives its group a scratch buffer).
  void OnChildStart(size_t c);
  // grads[0, ready_floats) are final: launches every group that lies inside, then polls.
  void OnReady(int64_t ready_floats);
  // Launches what is left and waits for every group.
  void Finish();
  double last_wait_seconds() const { return last_wait_s_; }

  // The gradients the optimizer steps with: the flat buffer (optimizer mode; this rank's
  // chunks hold the sums) or this rank's shard (gradients mode).
  const Tensor& step_grads() const;
  // This rank's reduced gradient chunks, one view per group.
  std::vector<Tensor> OwnedGrads() const;

  // After the optimizer updated this rank's chunks of group g: starts sending them to every
  // rank. WaitParams() waits for every group started.
  void GatherParamsAsync(size_t g);
  void WaitParams();

 private:
  void Complete(size_t g);  // group g's reduce-scatter is done

  Backend& be_;
  Communicator& comm_;
  Model& model_;
  ShardMode mode_;
  ShardLayout layout_;
  Tensor shard_grads_;              // gradients mode: this rank's reduced chunks
  std::vector<Tensor> scratch_;     // gradients mode: per group, while it is in use
  std::vector<Tensor> flat_views_;  // optimizer mode: the groups of the flat gradient buffer
  std::vector<std::unique_ptr<CommHandle>> inflight_;  // indexed by group
  std::vector<std::unique_ptr<CommHandle>> gathers_;
  size_t next_ = 0, done_ = 0;
  int64_t saving_floats_ = 0;  // the flat gradient buffer less this rank's shard
  bool accumulate_ = false;
  double last_wait_s_ = 0;
};

// What training and `dptrain plan` say when "gradients" runs as "optimizer".
inline constexpr const char* kGradientsRunAsOptimizer =
    "dist.shard = \"gradients\" runs as \"optimizer\" for this model: one of its gradient groups "
    "(at least one whole layer's gradients) needs more scratch than sharding the gradients "
    "saves, so the flat gradient buffer is kept (lowering dist.bucket_mb does not split a layer)";

// The Model layout dist.shard needs on `world` ranks: groups of about `bucket_bytes` (the
// first 1 MiB), each `world` chunks of whole 64-byte lines; the plain layout when nothing is
// sharded (`none`, or 1 rank).
FlatLayout ShardedFlatLayout(ShardMode mode, int world, size_t bucket_bytes);
// What `dptrain plan` (PlanMemory) counts as split over the ranks for `mode` on `world` ranks.
StateSharding PlanSharding(ShardMode mode, int world);

}  // namespace dptrain
