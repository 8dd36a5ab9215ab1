// SPDX-License-Identifier: Apache-2.0
// One optimizer step (runtime/trainer_impl.h): `accumulate` micro-steps over slices of this rank's
// share of the global batch, the last one's backward overlapped with the bucketed gradient
// reduction; the agreed non-finite check (loss scaling skips, fp32 stops); the optimizer; the
// periodic replica check; the test hooks of runtime/train_hooks.h.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <limits>
#include <string>

#include "core/error.h"
#include "datasets/synthetic.h"
#include "runtime/agreement.h"
#include "runtime/comm/replica_check.h"
#include "runtime/comm/watchdog.h"
#include "runtime/trainer_impl.h"

namespace dptrain {

void Trainer::UploadBatch(const HostBatch& b, int64_t begin, int64_t n, bool teacher_targets) {
  const int64_t per = model_->input_shape().numel();
  Tensor x = x_dev_.Batch(n);
  be_.CopyFromHostAsync(b.images.data() + begin * per, &x);
  if (regression_ && !teacher_targets) {
    // Regression on a dataset file: the integer label is the target value.
    targets_host_.assign(static_cast<size_t>(n), 0.f);
    for (int64_t i = 0; i < n; ++i) {
      targets_host_[static_cast<size_t>(i)] =
          static_cast<float>(b.labels[static_cast<size_t>(begin + i)]);
    }
    Tensor y = y_dev_.Batch(n);
    be_.CopyFromHostAsync(targets_host_.data(), &y);
  } else if (regression_) {
    // Targets from the fixed teacher of the synthetic regression task.
    targets_host_.assign(static_cast<size_t>(n), 0.f);
    for (int64_t i = 0; i < n; ++i) {
      targets_host_[static_cast<size_t>(i)] =
          TeacherTarget(teacher_, b.images.data() + (begin + i) * per, per);
    }
    Tensor y = y_dev_.Batch(n);
    be_.CopyFromHostAsync(targets_host_.data(), &y);
  } else {
    // The dataset checked every label when it opened the file; this is the cheap per-batch
    // guarantee the device loss relies on (it reports a bad label only at its next
    // synchronisation).
    const int64_t classes = cfg_.model.classes;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t label = b.labels[static_cast<size_t>(begin + i)];
      if (label < 0 || label >= classes) {
        const auto at = static_cast<size_t>(begin + i);
        DPT_THROW(DataError) << "label " << label << " of sample "
                             << (at < b.indices.size() ? b.indices[at] : begin + i)
                             << " is outside [0, " << classes << ") (model.classes)";
      }
    }
    Tensor y = y_dev_.Batch(n);
    be_.CopyFromHostAsync(b.labels.data() + begin, &y);
  }
}

void Trainer::PushLoss(const Tensor& loss_sum) {
  ReserveLossLog(1);
  Tensor slot = loss_log_.View(Shape{1}, static_cast<size_t>(loss_log_n_) * sizeof(float));
  be_.Copy(loss_sum, &slot);
  ++loss_log_n_;
}

void Trainer::FlushLossLog() {
  if (loss_log_n_ == 0) return;
  std::vector<float> host(static_cast<size_t>(loss_log_n_));
  be_.CopyToHost(loss_log_.View(Shape{loss_log_n_}), host.data());
  // The order and arithmetic of adding each micro-step's loss as it came.
  for (float v : host) win_loss_ += loss_divisor_ != 1 ? v / loss_divisor_ : v;
  loss_log_n_ = 0;
}

void Trainer::ReserveLossLog(int64_t entries) {
  const int64_t capacity = loss_log_.defined() ? loss_log_.numel() : 0;
  if (loss_log_n_ + entries <= capacity) return;
  FlushLossLog();
  if (entries <= capacity) return;
  // A few hundred steps' worth: the log line usually comes first.
  loss_log_ =
      be_.Empty(Shape{std::max<int64_t>(256, 2 * entries)}, DType::kF32, "training loss log");
}

void Trainer::TrainStep(const HostBatch& batch) {
  Watchdog::SetStep(step_);
  grad_sq_saved_.reset();  // of the gradients this step replaces
  if (buffers_at_step_.defined()) be_.Copy(model_->buffers(), &buffers_at_step_);
  std::string oom;
  while (true) {
    ReserveLossLog(accumulate_);
    const int64_t logged_before = loss_log_n_;
    if (RunMicroSteps(batch, &oom)) break;
    loss_log_n_ = logged_before;  // the step runs again: its losses count once
    ShrinkMicroBatchMidRun(oom);
    oom.clear();
  }
  lr_ = LearningRate(sched_, step_);
  if (step_ == env_.hooks.inf_grad_step && comm_.rank() == env_.hooks.inf_grad_rank) {
    // Test hook: an overflow in one rank's gradients.
    const float inf = std::numeric_limits<float>::infinity();
    Tensor first =
        sharded_ ? sharded_->OwnedGrads()[0].View(Shape{1}) : model_->grads().View(Shape{1});
    be_.CopyFromHost(&inf, &first);
  }
  // The non-finite check ends in an allreduce that waits for the slowest rank: communication,
  // not optimizer time, or a straggler would show up as every other rank's slow optimizer.
  auto t0 = Clock::now();
  const bool apply = CheckGradients();
  comm_s_ += Since(t0);
  t0 = Clock::now();
  if (!apply) {
    ++skipped_steps_;  // every rank skips this step together (loss scaling)
    skipped_in_window_.push_back(step_ + 1);
  } else {
    float scale = 1.f / (static_cast<float>(world_ * accumulate_) * scaler_->scale());
    if (cfg_.train.clip_grad_norm > 0) {
      // clip_grad_norm_ after the allreduce: the global L2 norm of the averaged gradient, and
      // its coefficient folded into the update's gradient scale (no pass over the gradients).
      // The norm is the one metrics.jsonl reports (before clipping, as clip_grad_norm_ returns).
      const double sq = sharded_ ? GradSquaredNorm() : be_.SumSquares(model_->grads());
      grad_sq_saved_ = sq;
      const double coef = cfg_.train.clip_grad_norm / (std::sqrt(sq) * scale + 1e-6);
      if (coef < 1) scale = static_cast<float>(scale * coef);
    }
    if (sharded_) {
      // Each rank updates its chunks and sends each group as soon as it is updated.
      opt_->StepShard(&model_->params(), sharded_->step_grads(), static_cast<float>(lr_), scale,
                      [this](size_t g) { sharded_->GatherParamsAsync(g); });
      sharded_->WaitParams();
    } else {
      opt_->Step(&model_->params(), model_->grads(), static_cast<float>(lr_), scale);
    }
  }
  be_.Synchronize();
  opt_s_ += Since(t0);
  ++step_;
  if (step_ == env_.hooks.flip_param_step && comm_.rank() == env_.hooks.flip_param_rank) {
    // Test hook: silent corruption of one parameter on one rank.
    Tensor first = model_->params().View(Shape{1});
    float v = 0;
    be_.CopyToHost(first, &v);
    v = std::nextafter(v, 1e30f);
    be_.CopyFromHost(&v, &first);
  }
  const int64_t every = cfg_.dist.check_replicas_every;
  if (every > 0 && world_ > 1 && step_ % every == 0) {
    t0 = Clock::now();
    try {
      CheckReplicasIdentical(control_, be_, model_->params(), step_);
    } catch (const InternalError& e) {
      throw AgreedError(e.what(), kExitInternal);  // every rank saw the same checksums
    }
    comm_s_ += Since(t0);
  }
  win_samples_ += local_batch_;
  ++win_steps_;
}

bool Trainer::RunMicroSteps(const HostBatch& batch, std::string* oom) {
  const bool recover = cfg_.memory.auto_microbatch;
  for (int64_t m = 0; m < accumulate_; ++m) {
    const bool last = m == accumulate_ - 1;
    // Only the last backward communicates (with more than one rank; with dist.shard =
    // "gradients" every backward does); everything before it is local to this rank, so a rank
    // that ran out of memory can skip to the agreement below.
    const bool every = sharded_ && sharded_->mode() == ShardMode::kGradients;
    const bool communicates = (last || every) && (reducer_ != nullptr || sharded_ != nullptr);
    const Tensor* dout = nullptr;
    auto t0 = Clock::now();
    if (oom->empty()) {
      try {
        if (m == 0 && step_ == env_.hooks.oom_step && comm_.rank() == env_.hooks.oom_rank &&
            !oom_hook_fired_) {
          oom_hook_fired_ = true;
          throw OutOfMemory(RankTag() +
                            fmt::format("out of memory (test hook) at step {}", step_ + 1));
        }
        UploadBatch(batch, m * micro_, micro_, train_teacher_targets_);
        ForwardContext ctx;
        ctx.training = true;
        ctx.seed = static_cast<uint64_t>(cfg_.seed);
        ctx.step = step_;
        ctx.sample_offset = comm_.rank() * local_batch_ + m * micro_;
        const Tensor x = x_dev_.Batch(micro_);
        const Tensor y = y_dev_.Batch(micro_);
        const Tensor& out = model_->Forward(x, ctx);
        loss_->Forward(out, y);
        // Regression: the mean over the model's outputs per sample.
        const int64_t outputs_per_sample = out.numel() / micro_;
        loss_divisor_ = regression_ ? static_cast<double>(outputs_per_sample) : 1.0;
        PushLoss(loss_->loss_sum());
        dout = &loss_->Backward(out, y, micro_, scaler_->scale());
        // On a GPU the phases' times are their kernels', not their launches': without these
        // waits one GPU's whole step showed up as the next wait, "exposed communication". The
        // host has nothing else to launch meanwhile, so they cost only the launch lead.
        be_.Synchronize();
        fwd_s_ += Since(t0);
        t0 = Clock::now();
        if (!communicates) {
          model_->Backward(*dout, m > 0);
          be_.Synchronize();
          bwd_s_ += Since(t0);
        }
      } catch (const OutOfMemory& e) {
        if (!recover) throw;
        *oom = e.what();
      }
    }
    if (recover && (last || communicates)) {
      int64_t failed = oom->empty() ? 0 : 1;
      control_.AllReduceHost(&failed, 1, ReduceOp::kMax);
      if (failed != 0) return false;
    }
    if (communicates && sharded_) {
      t0 = Clock::now();
      sharded_->Begin(m > 0);
      // Gradients mode: every layer writes a fresh scratch buffer (the sum is in the shard).
      model_->Backward(
          *dout, m > 0 && !every, [this](int64_t n) { sharded_->OnReady(n); },
          [this](size_t c) { sharded_->OnChildStart(c); });
      be_.Synchronize();  // the backward kernels (the collectives run on their own stream)
      bwd_s_ += Since(t0);
      KillHookInCollective();
      t0 = Clock::now();
      sharded_->Finish();
      comm_s_ += Since(t0);
    } else if (communicates) {
      t0 = Clock::now();
      reducer_->Begin();
      model_->Backward(*dout, m > 0, [this](int64_t n) { reducer_->OnReady(n); });
      be_.Synchronize();  // the backward kernels (the collectives run on their own stream)
      bwd_s_ += Since(t0);
      KillHookInCollective();
      t0 = Clock::now();
      reducer_->Finish();
      comm_s_ += Since(t0);
    }
  }
  return true;
}

void Trainer::KillHookInCollective() const {
  if (step_ != env_.hooks.kill_step || comm_.rank() != env_.hooks.kill_rank) return;
  // Test hook: this rank is lost with its gradient collectives enqueued, its peers inside them.
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string line = fmt::format(
      "test hook: rank {} kills itself (SIGKILL) with its step-{} gradient collectives "
      "in flight, at unix time {:.3f}\n",
      comm_.rank(), step_ + 1, now);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

bool Trainer::CheckGradients() {
  int64_t bad = 0;
  if (sharded_) {
    // This rank's reduced chunks; the agreement below covers the whole buffer.
    for (const Tensor& g : sharded_->OwnedGrads()) bad += be_.CountNonFinite(g) > 0 ? 1 : 0;
  } else {
    bad = be_.CountNonFinite(model_->grads()) > 0 ? 1 : 0;
  }
  control_.AllReduceHost(&bad, 1, ReduceOp::kMax);
  // The step being taken, counted from 1 as progress lines and metrics.jsonl count it.
  const int64_t this_step = step_ + 1;
  const auto last_good = [&] {
    return result_.last_checkpoint.empty() ? std::string("none") : result_.last_checkpoint;
  };
  if (scaler_->enabled()) {
    const double before = scaler_->scale();
    const bool was_at_minimum = scaler_->at_minimum();
    const bool skip = scaler_->Update(bad != 0);
    if (skip && was_at_minimum) {
      // Halving cannot help any more: the gradients overflow at the smallest scale, so the
      // run has diverged and would skip every step to the end (PyTorch's GradScaler would).
      // The scaler's state is the same on every rank, so every rank stops here together.
      throw AgreedError(
          RankTag() +
              fmt::format("loss scaling: non-finite gradients at step {} with the loss scale "
                          "already at its minimum ({}); the run has diverged ({} steps skipped "
                          "before it). Last good checkpoint: {}. hint: lower train.lr, add "
                          "train.warmup_steps, check the data for NaN/Inf",
                          this_step, before, skipped_steps_, last_good()),
          kExitData);
    }
    if (skip) {
      Say(
          fmt::format("loss scaling: non-finite gradients at step {}; step skipped on every rank, "
                      "scale {} -> {}",
                      this_step, before, static_cast<double>(scaler_->scale())));
    }
    return !skip;
  }
  if (bad == 0) return true;
  // fp32: the first layer (in forward order) whose gradient is not finite, on this rank.
  std::string first;
  for (const auto& g : model_->named_grads()) {
    if (be_.CountNonFinite(g.tensor) > 0) {
      first = g.name;
      break;
    }
  }
  const auto names = control_.AllGatherStrings(first);
  std::string where;
  for (const auto& n : names) {
    if (!n.empty()) {
      where = n;
      break;
    }
  }
  throw AgreedError(
      RankTag() + fmt::format("non-finite gradient at step {} (first in {}); the parameters were "
                              "not updated. Last good checkpoint: {}. hint: lower train.lr, add "
                              "train.warmup_steps, check the data for NaN/Inf",
                              this_step, where.empty() ? "an unknown layer" : where, last_good()),
      kExitData);
}

}  // namespace dptrain
