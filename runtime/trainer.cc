// SPDX-License-Identifier: Apache-2.0
// The training loop (runtime/trainer_impl.h says where the rest of the Trainer lives). One
// optimizer step = `accumulate` micro-steps over slices of this rank's share of the global
// batch; only the last micro-step's backward reduces gradients (bucketed, overlapped). Metrics
// are summed over ranks before rank 0 reports them. Checkpoints: rank 0 reads (resume/init) and
// broadcasts; rank 0 snapshots to host memory and a background thread writes; a per-step
// allreduce of two flags agrees on preemption and on a failed write.
#include "runtime/trainer.h"

#include <fmt/format.h>

#include <csignal>

#include "core/error.h"
#include "runtime/agreement.h"
#include "runtime/comm/watchdog.h"
#include "runtime/signals.h"
#include "runtime/trainer_impl.h"

namespace dptrain {

void Trainer::Say(const std::string& line) const {
  if (!is_root()) return;
  if (env_.interactive) fmt::print("\n");
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

void Trainer::Warn(const std::string& line) const {
  if (!is_root()) return;
  std::fflush(stdout);
  fmt::print(stderr, "dptrain: warning: {}\n", line);
  std::fflush(stderr);
}

// At a step boundary, on every rank: did any rank get a stop signal, did rank 0's last write
// fail? One allreduce of two integers, so every rank takes the same decision at the same step.
bool Trainer::AgreeToStop() {
  int64_t v[2] = {PendingStopSignal(), writer_ != nullptr && writer_->failed() ? 1 : 0};
  if (env_.hooks.stop_at_step >= 0 && step_ == env_.hooks.stop_at_step &&
      comm_.rank() == comm_.size() - 1) {
    v[0] = SIGUSR1;
  }
  control_.AllReduceHost(v, 2, ReduceOp::kMax);
  if (v[1] != 0) {
    // Rank 0 rethrows the write error; every rank leaves with it (exit 6).
    RunAgreed(control_, [&] {
      if (writer_ != nullptr) writer_->Wait();
    });
  }
  ReportWrites();
  if (v[0] == 0) return false;
  stop_signal_ = static_cast<int>(v[0]);
  Say(
      fmt::format("dptrain: {} received: every rank stops after step {} (epoch {} + {}/{} steps); "
                  "writing a checkpoint",
                  SignalName(stop_signal_), step_, epoch_, in_epoch_, steps_per_epoch_));
  return true;
}

// All ranks agree on what they are about to run.
void Trainer::CheckRanksSeeSameData() {
  const int64_t shape = sample_shape_.numel();
  int64_t v[6] = {train_->info().size,
                  -train_->info().size,
                  test_ ? test_->info().size : -1,
                  test_ ? -test_->info().size : 1,
                  shape,
                  -shape};
  control_.AllReduceHost(v, 6, ReduceOp::kMax);
  // Every rank holds the same reduced values, so every rank reaches the same verdict.
  RunAgreed(control_, [&] {
    DPT_CHECK_AS(DataError, v[0] == -v[1] && v[2] == -v[3] && v[4] == -v[5])
        << "the ranks see different datasets (train samples " << -v[1] << ".." << v[0]
        << ", test samples " << -v[3] << ".." << v[2] << ", values per sample " << -v[5] << ".."
        << v[4] << "); every rank must read the same files";
  });
}

// A resumed run: rank 0's optimizer state everywhere, and the counters where it stopped.
void Trainer::StartFrom() {
  if (opt_->shard() != nullptr) {
    ScatterSlots(&resume_slots_);
  } else {
    for (Tensor& slot : opt_->slots()) comm_.Broadcast(&slot, 0);
  }
  step_ = start_.step;
  epoch_ = start_.epoch;
  in_epoch_ = start_.in_epoch;
  opt_->set_steps(start_.optimizer_steps);
  last_eval_step_ = start_.last_eval_step;
  last_ckpt_step_ = step_;
  lr_ = start_.lr;
  elapsed_offset_ = start_.elapsed_s;
  skipped_steps_ = start_.skipped_steps;
  if (scaler_->enabled() && start_.loss_scale > 0) {
    scaler_->set_state({start_.loss_scale, start_.loss_scale_good_steps, start_.skipped_steps});
  }
  result_.resumed_from_step = step_;
  result_.epochs = epoch_;
}

TrainResult Trainer::Run() {
  RunAgreed(control_, [&] { SetupData(); });
  SetupModelThatFits();
  CheckRanksSeeSameData();
  if (cfg_.dist.shard != ShardMode::kNone && world_ == 1) {
    Warn(fmt::format("dist.shard = \"{}\" with 1 rank: nothing to shard, training unsharded",
                     ConfigName(cfg_.dist.shard)));
  }
  InstallStopSignalHandlers();
  ckpt_dir_ = cfg_.run_dir + "/checkpoints";
  ckpt_io_ = comm_.rank() == 0 && (!env_.hooks.quiet || env_.hooks.quiet_checkpoints);
  // Rank 0 reads what to start from (a failure is agreed: exit 6 everywhere, nothing written).
  RunAgreed(control_, [&] {
    if (ckpt_io_) LoadStartState();
  });
  control_.BroadcastHost(&start_, sizeof start_, 0);
  RunAgreed(control_, [&] {
    SetupRunDir();
    try {
      SetupCheckpointDir();
      SetupOutputs();
    } catch (...) {
      run_dir_lock_.Abandon();
      throw;
    }
  });
  // Rank 0's parameters everywhere (identical by seed already; with a checkpoint, only rank 0
  // has read it).
  comm_.Broadcast(&model_->params(), 0);
  comm_.Broadcast(&model_->buffers(), 0);
  if (start_.kind == kResumed) StartFrom();
  session_start_step_ = step_;
  WriteStartRecord();

  // train.winograd: said on the start line where it acts, warned about where it cannot.
  bool winograd = false;
  if (cfg_.train.winograd) {
    std::string why = env_.backend->WinogradProblem(cfg_.train.precision);
    if (why.empty() && winograd_gave_way_at_ > 0) {
      why = fmt::format("its buffers do not fit in {} at micro-batch {}",
                        cfg_.memory.limit_bytes > 0
                            ? fmt::format("memory.limit ({})", FormatBytes(cfg_.memory.limit_bytes))
                            : be_.name() + " memory",
                        winograd_gave_way_at_);
    }
    winograd = why.empty();
    if (!winograd) Warn("train.winograd changes nothing: " + why + "; convolutions run direct");
  }
  if (is_root()) {
    // Asked for, recompute says what it does, nothing included.
    std::string recompute;
    if (model_->net().recompute_segments() > 1) {
      recompute = fmt::format(", recompute ({} segments)", model_->net().recompute_segments());
    } else if (cfg_.memory.recompute) {
      recompute = ", recompute: none (no cut of this model holds less)";
    }
    fmt::print(
        "dptrain: {} ranks x {} threads, model {} ({} parameters), {} train samples, "
        "global batch {} ({} per rank{}), {} steps/epoch, {} steps{}{}{}{}\n",
        world_, env_.threads,
        cfg_.model.name.empty() ? std::string("from layers") : cfg_.model.name,
        model_->num_params(), train_->info().size, cfg_.train.global_batch, local_batch_,
        accumulate_ > 1 ? fmt::format(" = {} x {} micro-steps", micro_, accumulate_) : "",
        steps_per_epoch_, total_steps_, cfg_.train.deterministic ? ", deterministic" : "",
        winograd ? ", winograd" : "", recompute,
        // train.tf32 acts on fp32 convolutions on GPUs only.
        cfg_.train.tf32 && cfg_.train.precision == Precision::kF32 && be_.device() == Device::kCuda
            ? ", tf32 convolutions"
            : "");
    std::fflush(stdout);
  }

  run_start_ = Clock::now();
  win_start_ = run_start_;
  const int64_t every_steps = cfg_.checkpoint.every_steps;
  const int64_t every_epochs = cfg_.checkpoint.every_epochs;
  bool stopped = false;
  while (step_ < total_steps_ && !stopped) {
    loader_->Start(epoch_, in_epoch_);
    while (loader_->HasNext() && step_ < total_steps_) {
      Watchdog::SetStep(step_);
      if (AgreeToStop()) {
        stopped = true;
        break;
      }
      auto t0 = Clock::now();
      HostBatch batch = loader_->Next();
      data_wait_s_ += Since(t0);
      // train.profile measures from the session's second step (the first chooses algorithms
      // and allocates).
      const bool profiled = be_.profiling();
      const auto t_step = Clock::now();
      TrainStep(batch);
      loader_->Recycle(std::move(batch));
      if (profiled) {
        ++profiled_steps_;
        profiled_s_ += Since(t_step);
      } else if (cfg_.train.profile) {
        be_.ResetProfile();
        be_.EnableProfiling(true);
      }
      ++in_epoch_;
      LogStep(epoch_, false);
      // A step checkpoint that falls on the epoch's last step waits for the epoch's end.
      if (every_steps > 0 && step_ % every_steps == 0 && in_epoch_ < steps_per_epoch_) {
        SaveCheckpoint();
      }
    }
    loader_->Stop();
    LogStep(epoch_, true);
    if (stopped || in_epoch_ < steps_per_epoch_) continue;
    // Epoch end: metrics, evaluation, then a checkpoint positioned at the next epoch's start.
    result_.epochs = epoch_ + 1;
    if (is_root()) {
      WriteMetrics({{"kind", "epoch"},
                    {"step", step_},
                    {"epoch", epoch_ + 1},
                    {"time_s", RunTime()},
                    {"loss", result_.last_loss}});
    }
    if (cfg_.train.eval_every_epochs > 0 && (epoch_ + 1) % cfg_.train.eval_every_epochs == 0) {
      Evaluate(epoch_);
    }
    ++epoch_;
    in_epoch_ = 0;
    if ((every_epochs > 0 && epoch_ % every_epochs == 0) ||
        (every_steps > 0 && step_ % every_steps == 0)) {
      SaveCheckpoint();
    }
  }
  const double total = Since(run_start_);
  result_.steps = step_;
  result_.stop_signal = stop_signal_;
  const int64_t session_steps = step_ - session_start_step_;
  result_.samples_per_s =
      static_cast<double>(session_steps * cfg_.train.global_batch) / std::max(total, 1e-9);
  // Final evaluation if the last epoch's did not run (not when preempted: time is short).
  if (!stopped && test_ && cfg_.train.eval_every_epochs > 0 && step_ != last_eval_step_) {
    Evaluate(in_epoch_ == 0 && epoch_ > 0 ? epoch_ - 1 : epoch_);
  }
  // The end-of-training (or preemption) checkpoint; every rank waits until rank 0 has written
  // it and agrees on whether that worked.
  SaveCheckpoint();
  RunAgreed(control_, [&] {
    if (writer_ != nullptr) writer_->Wait();
  });
  ReportWrites();
  if (env_.hooks.keep_final_params) {
    auto keep = [&](const std::vector<NamedTensor>& named, auto* out) {
      for (const auto& p : named) {
        std::vector<float> v(static_cast<size_t>(p.tensor.numel()));
        be_.CopyToHost(p.tensor, v.data());
        out->emplace_back(p.name, std::move(v));
      }
    };
    keep(model_->named_params(), &result_.final_params);
    keep(model_->named_buffers(), &result_.final_buffers);
  }
  PrintSummary(stopped, session_steps, total);
  if (cfg_.train.profile) PrintProfile();
  be_.EnableProfiling(false);
  if (StopSignalCount() > 1) {
    Say(
        fmt::format("dptrain: {} stop signals received on this rank; the first one counted, the "
                    "others changed nothing",
                    StopSignalCount()));
  }
  // The signal is consumed; a later Train in this process starts clean.
  ClearStopSignals();
  return result_;
}

TrainResult Train(const TrainConfig& cfg, const TrainEnv& env) {
  DPT_CHECK(env.control != nullptr && env.comm != nullptr && env.backend != nullptr);
  Trainer t(cfg, env);
  try {
    return t.Run();
  } catch (const Error& e) {
    t.RecordError(e.what(), e.exit_code());
    throw;
  } catch (const std::exception& e) {
    t.RecordError(std::string("internal error: ") + e.what(), kExitInternal);
    throw;
  }
}

}  // namespace dptrain
