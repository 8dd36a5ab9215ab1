// SPDX-License-Identifier: Apache-2.0
// The Trainer behind Train and EvaluateCheckpoint (runtime/trainer.h), private to runtime/. One
// class holds a run's state; its members are implemented by concern, one file each:
//   trainer.cc    the loop (Run), agreement to stop at step boundaries
//   setup.cc      data, model and optimizer; the out-of-memory micro-batch search; run_dir
//   step.cc       one optimizer step: micro-steps, gradient check, replica check, test hooks
//   evaluator.cc  the test-set loop for training's evaluations and `dptrain eval`
//   state.cc      checkpoints: resume / init, snapshots, background writes
//   metrics.cc    progress lines, metrics.jsonl, peak memory, the final summary
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "datasets/sampler.h"
#include "models/loss.h"
#include "models/model.h"
#include "runtime/amp/loss_scaler.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/reducer.h"
#include "runtime/comm/sharded_reducer.h"
#include "runtime/optim/optimizer.h"
#include "runtime/run_dir_lock.h"
#include "runtime/trainer.h"

namespace dptrain {

using Clock = std::chrono::steady_clock;
inline double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// "1h02m", "3m05s", "42s"; "?" when not finite.
std::string FormatDuration(double s);

// Where a run starts: fresh, from checkpoint.init (parameters only) or resumed. Rank 0 decides
// and broadcasts it as raw bytes, so plain fields only.
constexpr int64_t kFresh = 0, kInit = 1, kResumed = 2;
struct StartPoint {
  int64_t kind = kFresh;  // kFresh, kInit, kResumed
  int64_t step = 0, epoch = 0, in_epoch = 0, optimizer_steps = 0, last_eval_step = -1;
  double elapsed_s = 0, lr = 0;
  double loss_scale = 0;
  int64_t loss_scale_good_steps = 0, skipped_steps = 0;
};

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const TrainEnv& env)
      : cfg_(cfg), env_(env), control_(*env.control), comm_(*env.comm), be_(*env.backend) {}

  TrainResult Run();
  EvalResult RunEval(const std::string& checkpoint);
  // Rank 0, not collective: an "error" record in metrics.jsonl for the error that ends the run
  // (what `dptrain report` shows for a failed run); nothing before metrics.jsonl is open.
  void RecordError(const std::string& message, int exit_code) noexcept;

 private:
  struct EvalSums {
    double loss = 0, correct = 0, samples = 0;
    // Per class (classification with model.classes known): test samples and argmax hits.
    std::vector<double> class_samples, class_correct;
  };

  // ---- setup.cc ----
  // The datasets, sampler, loader and batch sizes; with eval_only_ the test set alone (the batch
  // is this rank's share of train.global_batch).
  void SetupData();
  bool IsRegression() const;  // model.loss resolves to "mse"
  // data.train / data.test: generated ("synthetic") or an HDF5 file, checked against the model.
  std::unique_ptr<Dataset> OpenData(const std::vector<std::string>& files,
                                    const Shape& synthetic_shape, int64_t synthetic_samples,
                                    uint64_t seed) const;
  std::unique_ptr<Graph> BuildNet() const;  // model.name or model.layers
  void SetupModel();
  FlatLayout FlatLayoutFor() const;  // the model's flat layout for dist.shard on world_ ranks
  // Rank 0: creates run_dir and holds an exclusive lock on run_dir/.dptrain.lock for the
  // process's life, so that a second run with the same run_dir stops (exit 2) instead of
  // overwriting this one's checkpoints and metrics.
  void SetupRunDir();
  RunDirLock run_dir_lock_;
  void SetupOutputs();
  // SetupModel on every rank; when a rank runs out of memory, all ranks agree on it before any
  // collective. train.winograd gives way first (its buffers are the one cost that buys only
  // speed: the run goes on direct, warned). Then, with memory.auto_microbatch, halve the
  // micro-batch (doubling accumulate, so the global batch and the maths stay the same) until it
  // fits or is 1; otherwise the OOM report with advice, on every rank (exit 4).
  void SetupModelThatFits();
  // The micro-batch at which train.winograd's buffers did not fit (0: they did, or it is off).
  int64_t winograd_gave_way_at_ = 0;
  // Also sets shard_advice_ (dist.shard advice when optimizer state dominates the plan).
  int64_t LargestMicroBatchThatFits(int64_t tried);
  std::string shard_advice_;
  void ReleaseModel();
  // After RunMicroSteps failed on every rank: the next smaller micro-batch (agreed exit 4 when
  // there is none), the model rebuilt for it with the parameters, buffers and optimizer state
  // the step started from. The caller runs the same step again.
  void ShrinkMicroBatchMidRun(const std::string& oom);
  // Collective: whether some rank ran a convolution by Winograd that has not yet given way.
  bool WinogradCanGiveWay();
  // The largest divisor of the per-rank batch at most half of `tried` (0: none).
  int64_t NextMicroBatch(int64_t tried) const;

  // ---- step.cc ----
  void TrainStep(const HostBatch& batch);
  // The step's micro-steps: forward, loss, backward; the last backward overlapped with the
  // gradient reduction. With memory.auto_microbatch an out-of-memory before that reduction is
  // agreed on by every rank (one small allreduce per step) and returns false with nothing
  // communicated; `oom` holds this rank's report ("" when another rank failed).
  bool RunMicroSteps(const HostBatch& batch, std::string* oom);
  // The kill_rank test hook (runtime/train_hooks.h), between backward and the collectives' wait.
  void KillHookInCollective() const;
  // After the gradient allreduce: do the gradients hold a non-finite value on any rank (the
  // ranks agree)? With loss scaling that skips the step and lowers the scale; without, it stops
  // the run naming the first layer with a non-finite gradient. Returns true to apply the step.
  bool CheckGradients();
  // Samples [begin, begin + n) of `b` into x_dev_ / y_dev_ without waiting for the device
  // (Backend::CopyFromHostAsync); class labels are checked on the host first. Regression
  // targets: the teacher's on generated data (`teacher_targets`), the integer label's value on
  // a file.
  void UploadBatch(const HostBatch& b, int64_t begin, int64_t n, bool teacher_targets);
  // The training loss of each micro-step stays on the device until the next log line, so that a
  // micro-step never waits for the device to read it: PushLoss copies it into loss_log_ (device
  // to device), FlushLossLog adds the entries to win_loss_ in micro-step order (one copy to the
  // host), ReserveLossLog makes room for a step's `entries` before it starts (flushing older
  // entries or growing), so that a step that runs again (auto_microbatch) only has to drop its
  // own entries (loss_log_n_ back to where the step began).
  void PushLoss(const Tensor& loss_sum);
  void FlushLossLog();
  void ReserveLossLog(int64_t entries);

  // ---- evaluator.cc: one loop over the test set for training and `dptrain eval` ----
  EvalSums RunTestSet();
  void Evaluate(int64_t epoch);

  // ---- metrics.cc ----
  // Collective at logged steps: the window's loss (allreduce) and one gather of every rank's
  // phase times and peak memory to rank 0, which writes the step record.
  void LogStep(int64_t epoch, bool force);
  // dist.shard: the squared norm of the last step's summed gradients (collective), and its
  // value kept by a checkpoint that reused the gradient buffer before the step was logged.
  double GradSquaredNorm();
  std::optional<double> grad_sq_saved_;
  void WriteMetrics(const nlohmann::json& j);
  void ReducePeakMemory();  // collective
  // Collective (every rank's host and device); rank 0 writes the "start" record: what ran.
  void WriteStartRecord();
  void PrintSummary(bool stopped, int64_t session_steps, double total_s);
  // train.profile: rank 0's table per op kind and per graph node, and its metrics.jsonl record.
  void PrintProfile();
  bool is_root() const { return comm_.rank() == 0 && !env_.hooks.quiet; }
  double RunTime() const { return elapsed_offset_ + Since(run_start_); }

  // ---- state.cc: checkpoints (resume, init, snapshots, background writes) ----
  void SetupCheckpointDir();
  std::vector<TensorSpec> ParamSpecs() const;
  std::vector<TensorSpec> OptimizerSpecs() const;
  void LoadStartState();  // rank 0: resume / init per cfg_.checkpoint
  void Resume(const std::string& path, const Checkpoint& c);
  void LoadFlat(const std::vector<NamedTensor>& named, Tensor* flat, const Checkpoint& c,
                const std::string& suffix, bool optimizer_group);
  void LoadTensors(const Checkpoint& c, bool with_optimizer);
  // sharded_slots: the optimizer's slots gathered from the shards (dist.shard), else empty.
  Checkpoint Snapshot(std::vector<std::vector<float>> sharded_slots = {});
  void SaveCheckpoint();
  void ReportWrites();
  // dist.shard: the optimizer's slot k for the whole flat buffer, gathered from every rank's
  // shard (collective; the result on rank 0 only, empty elsewhere), and the inverse: rank 0's
  // full slots (host) to every rank's shard.
  std::vector<float> GatherSlot(size_t k);
  void ScatterSlots(std::vector<std::vector<float>>* full);
  // The slots a resume loaded on rank 0 while the optimizer is sharded (ScatterSlots sends them).
  std::vector<std::vector<float>> resume_slots_;

  // ---- trainer.cc ----
  bool AgreeToStop();
  void CheckRanksSeeSameData();
  void StartFrom();  // step counters, optimizer and loss-scale state from start_
  void Say(const std::string& line) const;   // rank 0 (not quiet): stdout
  void Warn(const std::string& line) const;  // rank 0 (not quiet): stderr

  const TrainConfig& cfg_;
  const TrainEnv& env_;
  ControlPlane& control_;  // agreements, metrics (MPI)
  Communicator& comm_;     // gradients, parameter broadcasts (MPI or NCCL)
  Backend& be_;

  bool regression_ = false;
  bool eval_only_ = false;
  std::vector<float> teacher_;
  std::unique_ptr<Dataset> train_, test_;
  Shape sample_shape_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<TrainLoader> loader_;
  LoaderOptions loader_opts_;
  int64_t world_ = 1, local_batch_ = 0, micro_ = 0, accumulate_ = 1;
  int64_t steps_per_epoch_ = 0, total_steps_ = 0;

  std::unique_ptr<Model> model_;
  std::unique_ptr<Loss> loss_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<Reducer> reducer_;
  // dist.shard with more than one rank: replaces reducer_ (runtime/comm/sharded_reducer.h).
  std::unique_ptr<ShardedReducer> sharded_;
  // Regression targets from the teacher: the training / test set is generated ("synthetic").
  bool train_teacher_targets_ = false, test_teacher_targets_ = false;
  // fp16: dynamic loss scaling (TrainHooks::loss_scaling enables it in fp32 for tests).
  std::unique_ptr<LossScaler> scaler_;
  int64_t skipped_steps_ = 0;
  double peak_min_ = 0, peak_mean_ = 0, peak_max_ = 0;  // bytes, over ranks (at the last log)
  ScheduleConfig sched_;
  Tensor x_dev_, y_dev_;
  // memory.auto_microbatch: the model's buffers (batch-norm running statistics) as the step in
  // progress found them, so a step that runs out of memory can run again unchanged.
  Tensor buffers_at_step_;
  bool oom_hook_fired_ = false;
  bool setup_noted_shard_ = false;  // "gradients runs as optimizer" said once
  std::vector<float> targets_host_;

  int64_t step_ = 0;      // optimizer steps done
  int64_t epoch_ = 0;     // 0-based epoch in progress (= completed epochs)
  int64_t in_epoch_ = 0;  // steps done within epoch_
  int64_t session_start_step_ = 0;
  int64_t last_eval_step_ = -1;
  double lr_ = 0;
  double elapsed_offset_ = 0;  // training time of earlier sessions (from the checkpoint)
  // Logging window (local sums; reduced over ranks when logged).
  double win_loss_ = 0;
  Tensor loss_log_;  // f32 per-micro-step loss sums not yet in win_loss_ (PushLoss)
  int64_t loss_log_n_ = 0;
  double loss_divisor_ = 1;  // regression: the model's outputs per sample (mean over outputs)
  int64_t win_samples_ = 0, win_steps_ = 0;
  Clock::time_point win_start_, run_start_;
  double data_wait_s_ = 0, fwd_s_ = 0, bwd_s_ = 0, comm_s_ = 0, opt_s_ = 0;
  // train.profile: the steps measured (every step after the session's first) and their time.
  int64_t profiled_steps_ = 0;
  double profiled_s_ = 0;
  // The five phase totals above when the logging window started (data wait, forward, backward,
  // exposed communication, optimizer), and the steps skipped by loss scaling within it.
  double win_phase_start_[5] = {0, 0, 0, 0, 0};
  std::vector<int64_t> skipped_in_window_;
  TrainResult result_;
  std::ofstream metrics_;

  // Checkpoints. ckpt_io_: this rank reads and writes checkpoint files (rank 0).
  bool ckpt_io_ = false;
  std::string ckpt_dir_;
  StartPoint start_;
  std::unique_ptr<CheckpointWriter> writer_;
  int64_t last_ckpt_step_ = -1;
  std::map<int64_t, double> copy_s_;  // step -> seconds of its host copy, until reported
  int stop_signal_ = 0;
};

}  // namespace dptrain
