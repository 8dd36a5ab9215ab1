// SPDX-License-Identifier: Apache-2.0
// Reduce-scatter of gradient groups, the gradients mode's scratch buffers, and the all-gather
// of updated parameters.
#include "runtime/comm/sharded_reducer.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/error.h"

namespace dptrain {

FlatLayout ShardedFlatLayout(ShardMode mode, int world, size_t bucket_bytes) {
  FlatLayout l;
  if (mode == ShardMode::kNone || world <= 1) return l;
  l.group_multiple = 16 * static_cast<int64_t>(world);
  l.first_group_floats = (int64_t{1} << 20) / 4;
  l.group_floats = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / 4));
  l.flat_grads = mode != ShardMode::kGradients;
  if (!l.flat_grads) {
    // Groups small enough that two neighbours fit in what the mode saves (the flat gradients
    // less this rank's shard), so both may be in flight at once.
    l.group_cap = [world](int64_t total) { return (total - total / world) / 2; };
    l.keep_flat_grads = [world](const std::vector<std::pair<int64_t, int64_t>>& groups) {
      return ShardedGradScratchFloats(groups, world) < 0;
    };
  }
  return l;
}

StateSharding PlanSharding(ShardMode mode, int world) {
  StateSharding s;
  s.ranks = world;
  s.optimizer = mode == ShardMode::kOptimizer;
  s.grads = mode == ShardMode::kGradients;
  return s;
}

ShardedReducer::ShardedReducer(Backend& be, Communicator& comm, Model& model, ShardMode mode)
    : be_(be), comm_(comm), model_(model), mode_(mode) {
  DPT_CHECK(mode != ShardMode::kNone) << "ShardedReducer without dist.shard";
  // "gradients" whose scratch would cost more than it saves kept the flat gradient buffer
  // (ShardedFlatLayout): it runs as "optimizer".
  if (mode_ == ShardMode::kGradients && model.grads().defined()) mode_ = ShardMode::kOptimizer;
  layout_ = ShardLayout::Make(model.groups(), comm.rank(), comm.size());
  const size_t n = layout_.groups.size();
  if (!model.groups().empty()) {
    const int64_t flat = model.groups().back().second;
    saving_floats_ = flat - flat / std::max(comm.size(), 1);
  }
  inflight_.resize(n);
  if (mode_ == ShardMode::kGradients) {
    shard_grads_ =
        be_.Zeros(Shape{layout_.shard_floats}, DType::kF32, "gradients (this rank's shard)");
    scratch_.resize(n);
  } else {
    DPT_CHECK(model.grads().defined()) << "dist.shard = optimizer needs the flat gradients";
    for (const auto& g : layout_.groups) {
      flat_views_.push_back(
          model.grads().View(Shape{g.end - g.begin}, static_cast<size_t>(g.begin) * 4));
    }
  }
}

ShardedReducer::~ShardedReducer() {
  // Handles complete their collectives as they are destroyed; then no layer may keep a view
  // of a scratch buffer.
  inflight_.clear();
  gathers_.clear();
  for (size_t g = 0; g < scratch_.size(); ++g) {
    if (scratch_[g].defined()) model_.BindGroupGrads(g, Tensor());
  }
}

void ShardedReducer::Begin(bool accumulate) {
  DPT_CHECK(next_ == done_) << "ShardedReducer::Begin with groups in flight";
  next_ = 0;
  done_ = 0;
  accumulate_ = accumulate && mode_ == ShardMode::kGradients;
}

void ShardedReducer::OnChildStart(size_t c) {
  if (mode_ != ShardMode::kGradients) return;
  const int g = model_.group_of_child(c);
  if (g < 0 || scratch_[static_cast<size_t>(g)].defined()) return;
  // At most two groups' scratch at once, the one being written and the one being reduced, and
  // only while both fit in what the mode saves (the flat gradient buffer less this rank's
  // shard), so that "gradients" never holds more than "optimizer" (ShardedGradScratchFloats,
  // what `dptrain plan` counts). An older group still in flight is waited for first; MPI
  // progresses a non-blocking collective only inside MPI calls, so it might otherwise wait
  // for Finish() with every group's scratch alive.
  const auto& grp = layout_.groups[static_cast<size_t>(g)];
  const auto live = [&] {
    int64_t floats = 0;
    for (size_t i = done_; i < next_; ++i) floats += scratch_[i].numel();
    return floats;
  };
  while (next_ - done_ > 1 || (next_ > done_ && live() + (grp.end - grp.begin) > saving_floats_)) {
    inflight_[done_]->Wait();
    Complete(done_++);
  }
  Tensor s = be_.Empty(Shape{grp.end - grp.begin}, DType::kF32, "gradients (one group)");
  be_.Zero(&s);  // alignment padding is reduced too
  model_.BindGroupGrads(static_cast<size_t>(g), s);
  scratch_[static_cast<size_t>(g)] = std::move(s);
}

void ShardedReducer::OnReady(int64_t ready_floats) {
  while (next_ < layout_.groups.size() && layout_.groups[next_].end <= ready_floats) {
    if (mode_ == ShardMode::kGradients) {
      // Every group holds parameters of some child, whose start bound it.
      DPT_CHECK(scratch_[next_].defined()) << "gradient group " << next_ << " was never bound";
      inflight_[next_] = comm_.ReduceScatterAsync(&scratch_[next_], ReduceOp::kSum);
    } else {
      inflight_[next_] = comm_.ReduceScatterAsync(&flat_views_[next_], ReduceOp::kSum);
    }
    ++next_;
  }
  // Completes groups in order, so that scratch memory returns as early as possible.
  while (done_ < next_ && inflight_[done_]->Test()) Complete(done_++);
  for (size_t g = done_; g < next_; ++g) inflight_[g]->Test();
}

void ShardedReducer::Complete(size_t g) {
  inflight_[g].reset();
  if (mode_ != ShardMode::kGradients) return;
  const auto& grp = layout_.groups[g];
  const Tensor mine = scratch_[g].View(
      Shape{grp.chunk}, static_cast<size_t>(layout_.rank) * static_cast<size_t>(grp.chunk) * 4);
  Tensor dst = shard_grads_.View(Shape{grp.chunk}, static_cast<size_t>(grp.shard_offset) * 4);
  if (accumulate_) {
    be_.Add(dst, mine, &dst);
  } else {
    be_.Copy(mine, &dst);
  }
  model_.BindGroupGrads(g, Tensor());
  scratch_[g] = Tensor();  // back to the allocator
}

void ShardedReducer::Finish() {
  OnReady(std::numeric_limits<int64_t>::max());
  const auto t0 = std::chrono::steady_clock::now();
  while (done_ < next_) {
    inflight_[done_]->Wait();
    Complete(done_++);
  }
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const Tensor& ShardedReducer::step_grads() const {
  return mode_ == ShardMode::kGradients ? shard_grads_ : model_.grads();
}

std::vector<Tensor> ShardedReducer::OwnedGrads() const {
  std::vector<Tensor> out;
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    const auto& grp = layout_.groups[g];
    const int64_t at = mode_ == ShardMode::kGradients ? grp.shard_offset : layout_.OwnBegin(g);
    out.push_back(step_grads().View(Shape{grp.chunk}, static_cast<size_t>(at) * 4));
  }
  return out;
}

void ShardedReducer::GatherParamsAsync(size_t g) {
  const auto& grp = layout_.groups[g];
  Tensor view =
      model_.params().View(Shape{grp.end - grp.begin}, static_cast<size_t>(grp.begin) * 4);
  gathers_.push_back(comm_.AllGatherAsync(&view));
}

void ShardedReducer::WaitParams() {
  for (auto& h : gathers_) h->Wait();
  gathers_.clear();
}

}  // namespace dptrain
