// SPDX-License-Identifier: Apache-2.0
// The training loop. One optimizer step = `accumulate` micro-steps over slices of this rank's
// share of the global batch; only the last micro-step's backward reduces gradients (bucketed,
// overlapped). Metrics are summed over ranks before rank 0 reports them. Checkpoints: rank 0
// reads (resume/init) and broadcasts; rank 0 snapshots to host memory and a background thread
// writes; a per-step allreduce of two flags agrees on preemption and on a failed write.
#include "runtime/trainer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/util/rng.h"
#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "datasets/sampler.h"
#include "models/loss.h"
#include "models/memory_plan.h"
#include "models/model.h"
#include "models/zoo/zoo.h"
#include "runtime/amp/loss_scaler.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/reducer.h"
#include "runtime/comm/replica_check.h"
#include "runtime/comm/watchdog.h"
#include "runtime/optim/optimizer.h"

namespace dptrain {

namespace detail {
void AgreeOnFailure(Communicator& comm, const std::string& msg, int code, bool failed) {
  int64_t first = failed ? comm.rank() : comm.size();
  comm.AllReduceHost(&first, 1, ReduceOp::kMin);
  if (first == comm.size()) return;
  // The lowest failing rank tells everyone what happened.
  int64_t c = code;
  comm.BroadcastHost(&c, sizeof c, static_cast<int>(first));
  int64_t len = static_cast<int64_t>(msg.size());
  comm.BroadcastHost(&len, sizeof len, static_cast<int>(first));
  std::string text(static_cast<size_t>(len), '\0');
  if (comm.rank() == first) text = msg;
  comm.BroadcastHost(text.data(), text.size(), static_cast<int>(first));
  throw AgreedError(text, static_cast<int>(c));
}
}  // namespace detail

namespace {

// Set when a stop signal arrives (by the sigwait thread, or the fallback handler: lock-free
// atomics are async-signal-safe); read at step boundaries.
std::atomic<int> g_stop_signal{0};
std::atomic<int> g_signal_count{0};
static_assert(std::atomic<int>::is_always_lock_free);

void OnStopSignal(int sig) {
  g_stop_signal.store(sig);
  g_signal_count.fetch_add(1);
}

std::string SignalName(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGUSR1) return "SIGUSR1";
  return "signal " + std::to_string(sig);
}

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Synthetic data: deterministic from the seed, identical on every rank.
//  - regression (the `linear` model): x uniform in [-1, 1]^F; the target is a fixed teacher
//    y = w*.x + b* computed in the trainer (the dataset's labels are unused);
//  - classification: uniform pixels, labels from a fixed random linear teacher (learnable).

std::vector<float> TeacherWeights(int64_t features, uint64_t seed) {
  SplitMix64 rng(seed ^ 0x7EAC4E2ull);
  std::vector<float> w(static_cast<size_t>(features) + 1);
  for (auto& v : w) v = 2 * rng.NextFloat() - 1;
  return w;  // last entry: bias
}

std::unique_ptr<Dataset> MakeSynthetic(const Shape& sample, int64_t n, int64_t classes,
                                       bool regression, uint64_t seed) {
  const int64_t per = sample.numel();
  std::vector<float> images(static_cast<size_t>(n * per));
  std::vector<int32_t> labels(static_cast<size_t>(n), 0);
  SplitMix64 rng(seed);
  for (auto& v : images) v = regression ? 2 * rng.NextFloat() - 1 : rng.NextFloat();
  if (!regression) {
    // Labels from a random linear teacher over the pixels.
    std::vector<float> w(static_cast<size_t>(per * classes));
    SplitMix64 t(seed ^ 0xC1A55ull);
    for (auto& v : w) v = 2 * t.NextFloat() - 1;
    for (int64_t i = 0; i < n; ++i) {
      int32_t best = 0;
      double best_v = -1e300;
      for (int64_t c = 0; c < classes; ++c) {
        double s = 0;
        for (int64_t j = 0; j < per; ++j) {
          s += (images[static_cast<size_t>(i * per + j)] - 0.5f) *
               w[static_cast<size_t>(c * per + j)];
        }
        if (s > best_v) {
          best_v = s;
          best = static_cast<int32_t>(c);
        }
      }
      labels[static_cast<size_t>(i)] = best;
    }
  }
  return MakeMemoryDataset(std::move(images), std::move(labels), sample);
}

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = std::llround(s);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

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
      : cfg_(cfg), env_(env), comm_(*env.comm), be_(*env.backend) {}

  TrainResult Run();
  EvalResult RunEval(const std::string& checkpoint);

 private:
  struct EvalSums {
    double loss = 0, correct = 0, samples = 0;
  };

  void SetupData();
  void SetupEvalData();
  bool IsRegression() const;  // model.loss resolves to "mse"
  // data.train / data.test: generated ("synthetic") or an HDF5 file, checked against the model.
  std::unique_ptr<Dataset> OpenData(const std::string& path, const Shape& synthetic_shape,
                                    int64_t synthetic_samples, uint64_t seed) const;
  std::unique_ptr<Sequential> BuildNet() const;  // model.name or model.layers
  void SetupModel();
  void SetupRunDir();
  void SetupOutputs();
  void SetupCheckpointDir();
  void TrainStep(const HostBatch& batch);
  // SetupModel on every rank; when a rank runs out of memory, all ranks agree on it before any
  // collective, and with memory.auto_microbatch halve the micro-batch (doubling accumulate, so
  // the global batch and the maths stay the same) until it fits or is 1; otherwise the OOM
  // report with advice, on every rank (exit 4).
  void SetupModelThatFits();
  int64_t LargestMicroBatchThatFits(int64_t tried);
  void ReducePeakMemory();  // collective
  void ReleaseModel();
  // After the gradient allreduce: do the gradients hold a non-finite value on any rank (the
  // ranks agree)? With loss scaling that skips the step and lowers the scale; without, it stops
  // the run naming the first layer with a non-finite gradient. Returns true to apply the step.
  bool CheckGradients();
  EvalSums RunTestSet();
  void Evaluate(int64_t epoch);
  void LogStep(int64_t epoch, bool force);
  void WriteMetrics(const nlohmann::json& j);
  void UploadBatch(const HostBatch& b, int64_t begin, int64_t n);
  bool is_root() const { return comm_.rank() == 0 && !env_.hooks.quiet; }
  double RunTime() const { return elapsed_offset_ + Since(run_start_); }

  // ---- checkpoints ----
  std::vector<TensorSpec> ParamSpecs() const;
  std::vector<TensorSpec> OptimizerSpecs() const;
  void LoadStartState();  // rank 0: resume / init per cfg_.checkpoint
  void Resume(const std::string& path, const Checkpoint& c);
  void LoadFlat(const std::vector<NamedTensor>& named, Tensor* flat, const Checkpoint& c,
                const std::string& suffix, bool optimizer_group);
  void LoadTensors(const Checkpoint& c, bool with_optimizer);
  Checkpoint Snapshot();
  void SaveCheckpoint();
  bool AgreeToStop();
  void ReportWrites();
  void Say(const std::string& line) const;   // rank 0 (not quiet): stdout
  void Warn(const std::string& line) const;  // rank 0 (not quiet): stderr

  const TrainConfig& cfg_;
  const TrainEnv& env_;
  Communicator& comm_;
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
  bool teacher_targets_ = false;
  // fp16: dynamic loss scaling (TrainHooks::loss_scaling enables it in fp32 for tests).
  std::unique_ptr<LossScaler> scaler_;
  int64_t skipped_steps_ = 0;
  double peak_min_ = 0, peak_mean_ = 0, peak_max_ = 0;  // bytes, over ranks (at the last log)
  ScheduleConfig sched_;
  Tensor x_dev_, y_dev_;
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
  int64_t win_samples_ = 0, win_steps_ = 0;
  Clock::time_point win_start_, run_start_;
  double data_wait_s_ = 0, fwd_s_ = 0, bwd_s_ = 0, comm_s_ = 0, opt_s_ = 0;
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

bool Trainer::IsRegression() const { return ResolveLoss(cfg_.model) == LossKind::kMse; }

std::unique_ptr<Dataset> Trainer::OpenData(const std::string& path, const Shape& synthetic_shape,
                                           int64_t synthetic_samples, uint64_t seed) const {
  const auto& m = cfg_.model;
  if (path == "synthetic") {
    return MakeSynthetic(synthetic_shape, synthetic_samples, m.classes, regression_, seed);
  }
  OpenOptions o;
  o.classes = regression_ ? -1 : m.classes;
  o.cache = cfg_.data.cache;
  return OpenHdf5Dataset(path, o);
}

std::unique_ptr<Sequential> Trainer::BuildNet() const {
  const auto& m = cfg_.model;
  return m.name.empty() ? BuildFromLayers(be_, m.layers) : BuildZooModel(be_, m.name, m.classes);
}

void Trainer::SetupData() {
  const auto& d = cfg_.data;
  regression_ = IsRegression();
  const Shape synthetic_shape = DefaultSampleShape(cfg_.model);
  const uint64_t seed = static_cast<uint64_t>(cfg_.seed);
  train_ = OpenData(d.train, synthetic_shape, d.synthetic_samples, seed);
  sample_shape_ = train_->info().sample_shape;
  // Generated test samples take the training samples' shape.
  if (!d.test.empty()) {
    test_ =
        OpenData(d.test, sample_shape_, std::max<int64_t>(d.synthetic_samples / 4, 1), seed + 1);
    DPT_CHECK_AS(DataError, test_->info().sample_shape == train_->info().sample_shape)
        << "data.test " << d.test << " has samples of shape "
        << test_->info().sample_shape.ToString() << " but data.train " << d.train << " has "
        << train_->info().sample_shape.ToString();
  }
  // Regression targets: the fixed teacher on generated data, the label's value on a file.
  teacher_targets_ = d.train == "synthetic";
  if (regression_) teacher_ = TeacherWeights(train_->info().sample_shape.numel(), seed);

  world_ = comm_.size();
  accumulate_ = cfg_.train.accumulate;
  const int64_t g = cfg_.train.global_batch;
  // The sampler checks that the global batch divides over the ranks and fits the dataset.
  sampler_ = std::make_unique<Sampler>(train_->info().size, g, static_cast<int>(world_),
                                       comm_.rank(), seed, d.shuffle);
  local_batch_ = sampler_->local_batch();
  DPT_CHECK_AS(ConfigError, local_batch_ % accumulate_ == 0)
      << "train.accumulate = " << accumulate_ << " does not divide the per-rank batch "
      << local_batch_ << " (train.global_batch " << g << " / " << world_ << " ranks)";
  micro_ = local_batch_ / accumulate_;
  steps_per_epoch_ = sampler_->steps_per_epoch();
  const int64_t by_epochs = cfg_.train.epochs * steps_per_epoch_;
  total_steps_ = cfg_.train.max_steps > 0
                     ? (cfg_.train.epochs > 0 ? std::min(cfg_.train.max_steps, by_epochs)
                                              : cfg_.train.max_steps)
                     : by_epochs;

  loader_opts_.workers = static_cast<int>(d.workers);
  loader_opts_.prefetch = std::max(2, 2 * static_cast<int>(d.workers));
  for (double v : d.mean) loader_opts_.mean.push_back(static_cast<float>(v));
  for (double v : d.std) loader_opts_.std.push_back(static_cast<float>(v));
  if (loader_opts_.mean.empty() && !train_->info().mean.empty()) {
    loader_opts_.mean = train_->info().mean;
    loader_opts_.std = train_->info().std;
  }
  loader_opts_.augment = d.augment;
  loader_opts_.seed = seed;
  loader_ = std::make_unique<TrainLoader>(*train_, *sampler_, loader_opts_);
}

// `dptrain eval`: only the test set. The batch is this rank's share of train.global_batch.
void Trainer::SetupEvalData() {
  const auto& d = cfg_.data;
  regression_ = IsRegression();
  DPT_CHECK_AS(ConfigError, !d.test.empty())
      << "dptrain eval needs a test set: data.test is empty in " << cfg_.source
      << " (set it, e.g. --set data.test=data/fmnist/test.h5)";
  const uint64_t seed = static_cast<uint64_t>(cfg_.seed);
  test_ = OpenData(d.test, DefaultSampleShape(cfg_.model),
                   std::max<int64_t>(d.synthetic_samples / 4, 1), seed + 1);
  sample_shape_ = test_->info().sample_shape;
  if (regression_) teacher_ = TeacherWeights(sample_shape_.numel(), seed);
  world_ = comm_.size();
  local_batch_ = std::max<int64_t>(1, cfg_.train.global_batch / world_);
  micro_ = local_batch_;
  for (double v : d.mean) loader_opts_.mean.push_back(static_cast<float>(v));
  for (double v : d.std) loader_opts_.std.push_back(static_cast<float>(v));
  if (loader_opts_.mean.empty() && !test_->info().mean.empty()) {
    loader_opts_.mean = test_->info().mean;
    loader_opts_.std = test_->info().std;
  }
  loader_opts_.seed = seed;
}

void Trainer::ReleaseModel() {
  reducer_.reset();
  opt_.reset();
  loss_.reset();
  model_.reset();
  x_dev_ = Tensor();
  y_dev_ = Tensor();
  be_.ReleasePlans();
  be_.allocator().EmptyCache();
}

int64_t Trainer::LargestMicroBatchThatFits(int64_t tried) {
  const int64_t budget = cfg_.memory.limit_bytes > 0
                             ? static_cast<int64_t>(cfg_.memory.limit_bytes)
                             : static_cast<int64_t>(be_.allocator().Capacity());
  if (budget <= 0) return 0;
  // As `dptrain plan` does: set the model up with memory.limit lifted (it is only a number) and
  // extrapolate its fixed and per-sample bytes to the budget. Micro-batch 1 first (small, and
  // conservative: constant workspaces count as per-sample there); then, when that predicts at
  // most 4x the budget for the micro-batch that failed, that micro-batch (`dptrain plan`'s
  // number). A device that is really full keeps the first estimate.
  const size_t limit = be_.allocator().budget();
  be_.allocator().set_budget(0);
  const auto plan_at = [&](int64_t micro) -> std::optional<MemoryPlan> {
    std::optional<MemoryPlan> plan;
    try {
      Model model(be_, BuildNet(), sample_shape_);
      model.Setup(micro, cfg_.train.precision);
      plan = PlanMemory(model, StateSlots(cfg_.train.optimizer, cfg_.train.momentum),
                        regression_ ? LossKind::kMse : LossKind::kCrossEntropy, budget);
    } catch (const OutOfMemory&) {
    }
    be_.ReleasePlans();
    be_.allocator().EmptyCache();
    return plan;
  };
  int64_t fits = 0;
  if (const auto one = plan_at(1)) {
    fits = one->max_micro_batch;
    if (one->fixed + one->per_sample * tried <= 4 * budget) {
      if (const auto at_tried = plan_at(tried)) fits = at_tried->max_micro_batch;
    }
  }
  be_.allocator().set_budget(limit);
  return fits;
}

void Trainer::SetupModelThatFits() {
  for (;;) {
    std::string oom;
    RunAgreed(comm_, [&] {
      try {
        SetupModel();
      } catch (const OutOfMemory& e) {
        oom = e.what();
      }
    });
    int64_t failed_rank = oom.empty() ? comm_.size() : comm_.rank();
    comm_.AllReduceHost(&failed_rank, 1, ReduceOp::kMin);
    if (failed_rank == comm_.size()) break;
    const int64_t tried = micro_;
    // The next micro-batch: the largest divisor of the per-rank batch at most half this one.
    int64_t next = 0;
    for (int64_t d = tried / 2; d >= 1; --d) {
      if (local_batch_ % d == 0) {
        next = d;
        break;
      }
    }
    if (!cfg_.memory.auto_microbatch || next == 0) {
      ReleaseModel();
      // Concrete advice: the micro-batch `dptrain plan` estimates to fit, as a divisor of the
      // per-rank batch, and the train.accumulate that keeps the global batch.
      const int64_t fits = LargestMicroBatchThatFits(tried);
      int64_t micro = 0;
      for (int64_t d = std::min(fits, tried - 1); d >= 1 && micro == 0; --d) {
        if (local_batch_ % d == 0) micro = d;
      }
      const std::string plan_cmd =
          fmt::format("dptrain plan --config {} --ranks {}",
                      cfg_.source.empty() ? std::string("FILE") : cfg_.source, world_);
      const std::string other_ways =
          fmt::format("use train.precision = \"bf16\" or \"fp16\"{}",
                      cfg_.memory.limit_bytes > 0 ? ", or raise memory.limit" : "");
      const std::string advice =
          micro > 0
              ? fmt::format(
                    "\nhint: micro-batch {} per rank does not fit; micro-batch {} should fit "
                    "(estimate of `{}`): set train.accumulate = {} (the global batch and the "
                    "maths stay the same), or set memory.auto_microbatch = true to let dptrain "
                    "find it, or {}",
                    tried, micro, plan_cmd, local_batch_ / micro, other_ways)
              : fmt::format(
                    "\nhint: micro-batch {} per rank does not fit, and by the estimate of `{}` "
                    "not even micro-batch 1 does: {}, or use a smaller model",
                    tried, plan_cmd, other_ways);
      detail::AgreeOnFailure(comm_, oom + advice, kExitOom, !oom.empty());
    }
    ReleaseModel();
    // AgreeOnFailure above threw when no smaller micro-batch exists, so next >= 1 here.
    micro_ = std::max<int64_t>(next, 1);
    accumulate_ = local_batch_ / micro_;
    Say(
        fmt::format("memory.auto_microbatch: micro-batch {} ran out of memory on rank {}; trying "
                    "{} x {} micro-steps per step (global batch {} unchanged)",
                    tried, failed_rank, micro_, accumulate_, cfg_.train.global_batch));
  }
  if (accumulate_ != cfg_.train.accumulate) {
    Say(fmt::format("memory.auto_microbatch: training with micro-batch {} x {} micro-steps", micro_,
                    accumulate_));
  }
}

void Trainer::SetupModel() {
  const auto& m = cfg_.model;
  model_ = std::make_unique<Model>(be_, BuildNet(), sample_shape_);
  model_->Setup(micro_, cfg_.train.precision);
  model_->InitParams(static_cast<uint64_t>(cfg_.seed));
  const LossKind kind = regression_ ? LossKind::kMse : LossKind::kCrossEntropy;
  if (kind == LossKind::kMse) {
    DPT_CHECK_AS(ConfigError, model_->output_shape().numel() == micro_)
        << "model.loss = \"mse\" regresses one value per sample, but the model outputs "
        << model_->output_shape().ToString() << "; end the model with a linear layer of out = 1";
  }
  if (kind == LossKind::kCrossEntropy) {
    DPT_CHECK_AS(ConfigError,
                 model_->output_shape().rank() == 2 && model_->output_shape()[1] == m.classes)
        << "the model's output " << model_->output_shape().ToString() << " does not match "
        << "model.classes = " << m.classes;
  }
  loss_ = std::make_unique<Loss>(be_, kind, model_->output_shape());
  Shape xs = model_->input_shape();
  std::vector<int64_t> dims{micro_};
  for (int64_t v : xs.dims()) dims.push_back(v);
  x_dev_ = be_.Empty(Shape(dims), DType::kF32, "input batch");
  if (regression_) {
    y_dev_ = be_.Empty(model_->output_shape().WithBatch(micro_), DType::kF32, "target batch");
  } else {
    y_dev_ = be_.Empty(Shape{micro_}, DType::kI32, "label batch");
  }
  if (eval_only_) return;

  OptimizerConfig oc;
  oc.kind = cfg_.train.optimizer;
  oc.momentum = cfg_.train.momentum;
  oc.nesterov = cfg_.train.nesterov;
  oc.weight_decay = cfg_.train.weight_decay;
  oc.beta1 = cfg_.train.beta1;
  oc.beta2 = cfg_.train.beta2;
  oc.eps = cfg_.train.eps;
  opt_ = std::make_unique<Optimizer>(be_, oc, model_->params());
  sched_.kind = cfg_.train.schedule;
  sched_.base_lr = cfg_.train.lr;
  sched_.warmup_steps = cfg_.train.warmup_steps;
  sched_.total_steps = std::max<int64_t>(total_steps_, 1);
  sched_.step_size =
      cfg_.train.step_size > 0 ? cfg_.train.step_size : std::max<int64_t>(steps_per_epoch_, 1);
  sched_.gamma = cfg_.train.gamma;
  if (world_ > 1) {
    reducer_ = std::make_unique<Reducer>(comm_, model_->grads(),
                                         static_cast<size_t>(cfg_.dist.bucket_mb) << 20);
  }
  scaler_ = std::make_unique<LossScaler>(cfg_.train.precision == Precision::kF16 ||
                                         env_.hooks.loss_scaling);
}

void Trainer::SetupRunDir() {
  if (!is_root()) return;
  std::error_code ec;
  std::filesystem::create_directories(cfg_.run_dir, ec);
  DPT_CHECK_AS(IoError, !ec) << "run_dir '" << cfg_.run_dir
                             << "' cannot be created: " << ec.message();
}

// After SetupRunDir and SetupCheckpointDir: a run that cannot checkpoint changes no file.
void Trainer::SetupOutputs() {
  if (!is_root()) return;
  {
    std::ofstream f(cfg_.run_dir + "/config.toml");
    f << env_.resolved_toml;
    DPT_CHECK_AS(IoError, f.good()) << "cannot write " << cfg_.run_dir << "/config.toml";
  }
  // A resumed run continues its metrics; a fresh one starts them over.
  metrics_.open(cfg_.run_dir + "/metrics.jsonl",
                start_.kind == kResumed ? std::ios::app : std::ios::trunc);
  DPT_CHECK_AS(IoError, metrics_.good()) << "cannot write " << cfg_.run_dir << "/metrics.jsonl";
}

// Rank 0: the checkpoint directory must be writable before any training time is spent.
void Trainer::SetupCheckpointDir() {
  if (!ckpt_io_) return;
  std::error_code ec;
  std::filesystem::create_directories(ckpt_dir_, ec);
  if (ec || !std::filesystem::is_directory(ckpt_dir_, ec)) {
    DPT_THROW(CheckpointError) << "cannot create the checkpoint directory " << ckpt_dir_ << ": "
                               << (ec ? ec.message() : "a file of that name exists")
                               << "; hint: point run_dir at a writable directory";
  }
  const std::string probe = ckpt_dir_ + "/.write-test-" + std::to_string(getpid());
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) {
    const int err = errno;
    DPT_THROW(CheckpointError) << "the checkpoint directory " << ckpt_dir_
                               << " is not writable: " << std::strerror(err)
                               << "; hint: point run_dir at a writable directory";
  }
  ::close(fd);
  ::unlink(probe.c_str());
  for (const std::string& p : RemoveStaleTemporaries(ckpt_dir_)) {
    Say("dptrain: removed " + p + ", the partial file of a checkpoint write that was killed");
  }
  writer_ = std::make_unique<CheckpointWriter>(ckpt_dir_, cfg_.checkpoint.keep,
                                               env_.hooks.checkpoint_pause);
}

void Trainer::WriteMetrics(const nlohmann::json& j) {
  if (!metrics_.is_open()) return;
  metrics_ << j.dump() << "\n";
  metrics_.flush();
}

void Trainer::UploadBatch(const HostBatch& b, int64_t begin, int64_t n) {
  const int64_t per = model_->input_shape().numel();
  Tensor x = x_dev_.Batch(n);
  be_.CopyFromHost(b.images.data() + begin * per, &x);
  if (regression_ && !teacher_targets_) {
    // Regression on a dataset file: the integer label is the target value.
    targets_host_.assign(static_cast<size_t>(n), 0.f);
    for (int64_t i = 0; i < n; ++i) {
      targets_host_[static_cast<size_t>(i)] =
          static_cast<float>(b.labels[static_cast<size_t>(begin + i)]);
    }
    Tensor y = y_dev_.Batch(n);
    be_.CopyFromHost(targets_host_.data(), &y);
  } else if (regression_) {
    // Targets from the fixed teacher of the synthetic regression task.
    targets_host_.assign(static_cast<size_t>(n), 0.f);
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = b.images.data() + (begin + i) * per;
      double s = teacher_[static_cast<size_t>(per)];
      for (int64_t j = 0; j < per; ++j)
        s += static_cast<double>(teacher_[static_cast<size_t>(j)]) * xi[j];
      targets_host_[static_cast<size_t>(i)] = static_cast<float>(s);
    }
    Tensor y = y_dev_.Batch(n);
    be_.CopyFromHost(targets_host_.data(), &y);
  } else {
    Tensor y = y_dev_.Batch(n);
    be_.CopyFromHost(b.labels.data() + begin, &y);
  }
}

void Trainer::TrainStep(const HostBatch& batch) {
  Watchdog::SetStep(step_);
  for (int64_t m = 0; m < accumulate_; ++m) {
    auto t0 = Clock::now();
    UploadBatch(batch, m * micro_, micro_);
    ForwardContext ctx;
    ctx.training = true;
    ctx.seed = static_cast<uint64_t>(cfg_.seed);
    ctx.step = step_;
    ctx.sample_offset = comm_.rank() * local_batch_ + m * micro_;
    const Tensor x = x_dev_.Batch(micro_);
    const Tensor y = y_dev_.Batch(micro_);
    const Tensor& out = model_->Forward(x, ctx);
    loss_->Forward(out, y);
    float loss_sum = 0;
    be_.CopyToHost(loss_->loss_sum(), &loss_sum);
    const int64_t outputs_per_sample = out.numel() / micro_;  // regression: mean over outputs
    win_loss_ += regression_ ? loss_sum / static_cast<double>(outputs_per_sample) : loss_sum;
    const Tensor& dout = loss_->Backward(out, y, micro_, scaler_->scale());
    fwd_s_ += Since(t0);
    t0 = Clock::now();
    const bool last = m == accumulate_ - 1;
    if (last && reducer_) {
      reducer_->Begin();
      model_->Backward(dout, m > 0, [this](int64_t n) { reducer_->OnReady(n); });
      bwd_s_ += Since(t0);
      t0 = Clock::now();
      reducer_->Finish();
      comm_s_ += Since(t0);
    } else {
      model_->Backward(dout, m > 0);
      bwd_s_ += Since(t0);
    }
  }
  auto t0 = Clock::now();
  lr_ = LearningRate(sched_, step_);
  if (step_ == env_.hooks.inf_grad_step && comm_.rank() == env_.hooks.inf_grad_rank) {
    // Test hook: an overflow in one rank's gradients.
    const float inf = std::numeric_limits<float>::infinity();
    Tensor first = model_->grads().View(Shape{1});
    be_.CopyFromHost(&inf, &first);
  }
  if (!CheckGradients()) {
    ++skipped_steps_;  // every rank skips this step together (loss scaling)
  } else {
    opt_->Step(&model_->params(), model_->grads(), static_cast<float>(lr_),
               1.f / (static_cast<float>(world_ * accumulate_) * scaler_->scale()));
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
    try {
      CheckReplicasIdentical(comm_, be_, model_->params(), step_);
    } catch (const InternalError& e) {
      throw AgreedError(e.what(), kExitInternal);  // every rank saw the same checksums
    }
  }
  win_samples_ += local_batch_;
  ++win_steps_;
}

bool Trainer::CheckGradients() {
  int64_t bad = be_.CountNonFinite(model_->grads()) > 0 ? 1 : 0;
  comm_.AllReduceHost(&bad, 1, ReduceOp::kMax);
  if (scaler_->enabled()) {
    const double before = scaler_->scale();
    const bool skip = scaler_->Update(bad != 0);
    if (skip) {
      Say(
          fmt::format("loss scaling: non-finite gradients at step {}; step skipped on every rank, "
                      "scale {} -> {}",
                      step_, before, static_cast<double>(scaler_->scale())));
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
  const auto names = comm_.AllGatherStrings(first);
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
                              step_, where.empty() ? "an unknown layer" : where,
                              result_.last_checkpoint.empty() ? std::string("none")
                                                              : result_.last_checkpoint),
      kExitData);
}

void Trainer::ReducePeakMemory() {
  // Peak device memory of each rank since the start: min, mean and max over ranks.
  const double peak = static_cast<double>(be_.allocator().stats().peak_in_use);
  double v[3] = {peak, -peak, peak};
  comm_.AllReduceHost(v, 2, ReduceOp::kMax);
  comm_.AllReduceHost(v + 2, 1, ReduceOp::kSum);
  peak_max_ = v[0];
  peak_min_ = -v[1];
  peak_mean_ = v[2] / static_cast<double>(world_);
}

void Trainer::LogStep(int64_t epoch, bool force) {
  if (win_steps_ == 0) return;
  if (!force && step_ % cfg_.train.log_every_steps != 0) return;
  double sums[2] = {win_loss_, static_cast<double>(win_samples_)};
  comm_.AllReduceHost(sums, 2, ReduceOp::kSum);
  ReducePeakMemory();
  const double loss = sums[0] / std::max(sums[1], 1.0);
  const double dt = Since(win_start_);
  const double sps = sums[1] / std::max(dt, 1e-9);
  result_.last_loss = loss;
  if (!std::isfinite(loss) && !scaler_->enabled()) {
    // The loss was summed over ranks: every rank sees it and stops alike.
    throw AgreedError(RankTag() + fmt::format("the training loss is {} at step {} (epoch {}); "
                                              "hint: lower train.lr, check the data for NaN/Inf, "
                                              "or use a warm-up (train.warmup_steps)",
                                              loss, step_, epoch + 1),
                      kExitData);
  }
  if (is_root()) {
    // ETA from this session's pace (a resumed run starts its clock again).
    const double session = Since(run_start_);
    const int64_t done = step_ - session_start_step_;
    const double eta =
        done > 0 ? session / static_cast<double>(done) * static_cast<double>(total_steps_ - step_)
                 : 0;
    const std::string line = fmt::format(
        "epoch {}/{} step {}/{} loss {:.4g} lr {:.4g} {:.0f} samples/s eta {}", epoch + 1,
        std::max<int64_t>(cfg_.train.epochs, (total_steps_ + steps_per_epoch_ - 1) /
                                                 std::max<int64_t>(steps_per_epoch_, 1)),
        step_, total_steps_, loss, lr_, sps, FormatDuration(eta));
    if (env_.interactive) {
      fmt::print("\r\033[K{}", line);
      std::fflush(stdout);
    } else {
      fmt::print("{}\n", line);
      std::fflush(stdout);
    }
    nlohmann::json j{
        {"kind", "step"},
        {"step", step_},
        {"epoch", epoch + 1},
        {"time_s", RunTime()},
        {"loss", loss},
        {"lr", lr_},
        {"samples_per_s", sps},
        {"micro_batch", micro_},
        {"accumulate", accumulate_},
        {"peak_mem_bytes", {{"min", peak_min_}, {"mean", peak_mean_}, {"max", peak_max_}}}};
    if (scaler_->enabled()) {
      j["loss_scale"] = static_cast<double>(scaler_->scale());
      j["skipped_steps"] = skipped_steps_;
    }
    WriteMetrics(j);
  }
  win_loss_ = 0;
  win_samples_ = 0;
  win_steps_ = 0;
  win_start_ = Clock::now();
}

Trainer::EvalSums Trainer::RunTestSet() {
  const auto [begin, end] = EvalShard(test_->info().size, static_cast<int>(world_), comm_.rank());
  LoaderOptions o = loader_opts_;
  o.augment = Augment::kNone;
  EvalLoader loader(*test_, begin, end, micro_, o);
  HostBatch b;
  double sums[3] = {0, 0, 0};  // loss, correct, samples
  ForwardContext ctx;
  ctx.training = false;
  while (loader.Next(&b)) {
    UploadBatch(b, 0, b.n);
    const Tensor x = x_dev_.Batch(b.n);
    const Tensor y = y_dev_.Batch(b.n);
    const Tensor& out = model_->Forward(x, ctx);
    loss_->Forward(out, y);
    float l = 0, c = 0;
    be_.CopyToHost(loss_->loss_sum(), &l);
    be_.CopyToHost(loss_->correct(), &c);
    const int64_t outputs_per_sample = out.numel() / b.n;
    sums[0] += regression_ ? l / static_cast<double>(outputs_per_sample) : l;
    sums[1] += c;
    sums[2] += static_cast<double>(b.n);
  }
  // Exact-once: every test sample is counted on exactly one rank.
  comm_.AllReduceHost(sums, 3, ReduceOp::kSum);
  return {sums[0], sums[1], sums[2]};
}

void Trainer::Evaluate(int64_t epoch) {
  if (!test_) return;
  last_eval_step_ = step_;
  const auto t0 = Clock::now();
  const EvalSums sums = RunTestSet();
  result_.test_loss = sums.loss / std::max(sums.samples, 1.0);
  result_.test_accuracy = regression_ ? -1 : sums.correct / std::max(sums.samples, 1.0);
  if (is_root()) {
    if (env_.interactive) fmt::print("\n");
    if (regression_) {
      fmt::print("eval epoch {} step {}: test_loss {:.6f} over {} samples ({:.1f}s)\n", epoch + 1,
                 step_, result_.test_loss, static_cast<int64_t>(sums.samples), Since(t0));
    } else {
      fmt::print(
          "eval epoch {} step {}: test_loss {:.4f} test_accuracy {:.4f} over {} samples "
          "({:.1f}s)\n",
          epoch + 1, step_, result_.test_loss, result_.test_accuracy,
          static_cast<int64_t>(sums.samples), Since(t0));
    }
    std::fflush(stdout);
    nlohmann::json j{{"kind", "eval"},
                     {"step", step_},
                     {"epoch", epoch + 1},
                     {"time_s", RunTime()},
                     {"test_loss", result_.test_loss},
                     {"test_samples", static_cast<int64_t>(sums.samples)}};
    if (!regression_) j["test_accuracy"] = result_.test_accuracy;
    WriteMetrics(j);
  }
}

// ---- checkpoints ----------------------------------------------------------------------------

// /params: the parameters, the buffers and, per batch-norm layer, the int64 num_batches_tracked
// that torch's state_dict has (dptrain does not use it, so a file may lack it).
std::vector<TensorSpec> Trainer::ParamSpecs() const {
  std::vector<TensorSpec> specs;
  for (const auto& p : model_->named_params()) specs.push_back({p.name, p.tensor.shape().dims()});
  for (const auto& b : model_->named_buffers()) {
    specs.push_back({b.name, b.tensor.shape().dims()});
    const std::string suffix = ".running_mean";
    if (b.name.size() > suffix.size() &&
        b.name.compare(b.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string layer = b.name.substr(0, b.name.size() - suffix.size());
      specs.push_back({layer + ".num_batches_tracked", {}, CheckpointDType::kI64, true});
    }
  }
  return specs;
}

std::vector<TensorSpec> Trainer::OptimizerSpecs() const {
  std::vector<TensorSpec> specs;
  for (const auto& slot : opt_->slot_names()) {
    for (const auto& p : model_->named_params()) {
      specs.push_back({p.name + "/" + slot, p.tensor.shape().dims()});
    }
  }
  return specs;
}

// Copies the checkpoint's tensors named `<name><suffix>` into the flat buffer `flat` (which
// keeps its alignment padding), in one host round trip.
void Trainer::LoadFlat(const std::vector<NamedTensor>& named, Tensor* flat, const Checkpoint& c,
                       const std::string& suffix, bool optimizer_group) {
  std::vector<float> host(static_cast<size_t>(flat->numel()));
  be_.CopyToHost(*flat, host.data());
  for (const auto& n : named) {
    const std::string name = n.name + suffix;
    const CheckpointTensor* t = optimizer_group ? c.FindOptimizer(name) : c.FindParam(name);
    DPT_CHECK(t != nullptr && t->dtype == CheckpointDType::kF32 &&
              static_cast<int64_t>(t->f32.size()) == n.tensor.numel())
        << "checkpoint tensor " << name << " was matched but cannot be loaded";
    std::copy(t->f32.begin(), t->f32.end(), host.begin() + n.offset);
  }
  be_.CopyFromHost(host.data(), flat);
}

void Trainer::LoadTensors(const Checkpoint& c, bool with_optimizer) {
  LoadFlat(model_->named_params(), &model_->params(), c, "", false);
  LoadFlat(model_->named_buffers(), &model_->buffers(), c, "", false);
  if (!with_optimizer) return;
  for (size_t k = 0; k < opt_->slot_names().size(); ++k) {
    LoadFlat(model_->named_params(), &opt_->slots()[k], c, "/" + opt_->slot_names()[k], true);
  }
}

void Trainer::LoadStartState() {
  const CheckpointConfig& cc = cfg_.checkpoint;
  std::optional<FoundCheckpoint> found;
  if (cc.resume == "auto") {
    std::vector<std::string> skipped;
    found = FindLatestCheckpoint(ckpt_dir_, &skipped);
    for (const std::string& why : skipped) Warn("skipping an invalid checkpoint: " + why);
    if (!found && !skipped.empty()) {
      // Starting over would let checkpoint.keep delete files someone may want to rescue.
      DPT_THROW(CheckpointError) << ckpt_dir_ << " holds " << skipped.size()
                                 << " checkpoint file(s) and none is valid (" << skipped.front()
                                 << "); nothing was changed. To start from scratch anyway, set "
                                 << "checkpoint.resume = \"never\" or use another run_dir";
    }
  } else if (cc.resume != "never") {
    Checkpoint c = ReadCheckpoint(cc.resume);
    if (!c.has_state) {
      DPT_THROW(CheckpointError) << "checkpoint.resume = " << cc.resume
                                 << ": a parameters-only file (no /state) cannot resume a run; "
                                 << "use checkpoint.init to start from its parameters";
    }
    found = FoundCheckpoint{cc.resume, std::move(c)};
  }
  if (found) {
    if (!cc.init.empty()) {
      Say("dptrain: resuming, so checkpoint.init = " + cc.init + " is not used");
    }
    Resume(found->path, found->ckpt);
    return;
  }
  if (cc.resume == "auto") {
    Say("dptrain: no checkpoint in " + ckpt_dir_ + ": starting from scratch");
  }
  if (cc.init.empty()) return;
  const Checkpoint c = ReadCheckpoint(cc.init);
  for (const std::string& n : c.notices) Say("dptrain: notice: " + n);
  MatchCheckpoint(cc.init, c, ParamSpecs(), nullptr);
  LoadTensors(c, false);
  start_.kind = kInit;
  Say(fmt::format("dptrain: parameters initialised from {} (checkpoint.init{})", cc.init,
                  c.has_state ? fmt::format(", saved at step {}", c.state.step) : ""));
}

void Trainer::Resume(const std::string& path, const Checkpoint& c) {
  for (const std::string& n : c.notices) Say("dptrain: notice: " + n);
  const CheckpointState& s = c.state;
  // The sample order is a function of (seed, dataset size, global batch): all must match.
  std::vector<std::string> differ;
  if (s.global_batch != cfg_.train.global_batch) {
    differ.push_back(fmt::format("train.global_batch is {} in the checkpoint, {} in this run",
                                 s.global_batch, cfg_.train.global_batch));
  }
  if (s.seed != cfg_.seed) {
    differ.push_back(
        fmt::format("seed is {} in the checkpoint, {} in this run", s.seed, cfg_.seed));
  }
  if (s.dataset_size != train_->info().size) {
    differ.push_back(fmt::format("the training set has {} samples in the checkpoint, {} now ({})",
                                 s.dataset_size, train_->info().size, cfg_.data.train));
  }
  if (s.optimizer != ConfigName(cfg_.train.optimizer)) {
    differ.push_back(fmt::format("train.optimizer is {} in the checkpoint, {} in this run",
                                 s.optimizer, ConfigName(cfg_.train.optimizer)));
  }
  if (!differ.empty()) {
    std::string what;
    for (const auto& d : differ) what += (what.empty() ? "" : "; ") + d;
    DPT_THROW(CheckpointError)
        << "checkpoint " << path << " cannot resume this run: " << what
        << ". Resuming continues the same sample order, on any number of ranks, only with the "
        << "same seed, training set and global batch (and optimizer); hint: use another run_dir, "
        << "or checkpoint.init = " << path << " to start a new run from its parameters";
  }
  const std::vector<TensorSpec> opt_specs = OptimizerSpecs();
  MatchCheckpoint(path, c, ParamSpecs(), &opt_specs);
  LoadTensors(c, true);
  DPT_CHECK_AS(CheckpointError, s.samples_in_epoch >= 0 && s.epoch >= 0 && s.step >= 0 &&
                                    s.samples_in_epoch % cfg_.train.global_batch == 0)
      << "checkpoint " << path << ": inconsistent /state (step " << s.step << ", epoch " << s.epoch
      << ", samples_in_epoch " << s.samples_in_epoch << ")";
  start_.kind = kResumed;
  start_.step = s.step;
  start_.epoch = s.epoch;
  start_.in_epoch = s.samples_in_epoch / cfg_.train.global_batch;
  if (start_.in_epoch >= steps_per_epoch_) {  // saved at the very end of an epoch
    ++start_.epoch;
    start_.in_epoch = 0;
  }
  start_.optimizer_steps = s.optimizer_steps;
  start_.last_eval_step = s.last_eval_step;
  start_.elapsed_s = s.elapsed_s;
  start_.lr = s.lr;
  start_.loss_scale = s.loss_scale;
  start_.loss_scale_good_steps = s.loss_scale_good_steps;
  start_.skipped_steps = s.skipped_steps;
  std::string line =
      fmt::format("dptrain: resuming from {}: step {}, epoch {} + {}/{} steps, saved by {} rank{}",
                  path, s.step, start_.epoch, start_.in_epoch, steps_per_epoch_,
                  s.world_size_at_save, s.world_size_at_save == 1 ? "" : "s");
  if (s.world_size_at_save != world_) {
    line += fmt::format(" (now {}: same global batch {}, {} per rank)", world_,
                        cfg_.train.global_batch, local_batch_);
  }
  if (s.step >= total_steps_) {
    line +=
        fmt::format("; it is at or past the last step ({}): nothing left to train", total_steps_);
  }
  Say(line);
}

Checkpoint Trainer::Snapshot() {
  Checkpoint c;
  CheckpointState& s = c.state;
  s.step = step_;
  s.epoch = epoch_;
  s.samples_in_epoch = in_epoch_ * cfg_.train.global_batch;
  s.seed = cfg_.seed;
  s.world_size_at_save = world_;
  s.global_batch = cfg_.train.global_batch;
  s.accumulate = accumulate_;
  s.dataset_size = train_->info().size;
  s.steps_per_epoch = steps_per_epoch_;
  s.optimizer_steps = opt_->steps();
  s.optimizer = ConfigName(cfg_.train.optimizer);
  s.schedule = ConfigName(cfg_.train.schedule);
  s.lr = lr_;
  s.last_eval_step = last_eval_step_;
  s.elapsed_s = RunTime();
  if (scaler_->enabled()) {
    s.loss_scale = scaler_->state().scale;
    s.loss_scale_good_steps = scaler_->state().good_steps;
  }
  s.skipped_steps = skipped_steps_;
  s.micro_batch = micro_;
  c.config_toml = env_.resolved_toml;
  c.optimizer_kind = ConfigName(cfg_.train.optimizer);
  // One device-to-host copy per flat buffer, then slices on the host.
  auto host = [&](const Tensor& flat) {
    std::vector<float> v(static_cast<size_t>(flat.numel()));
    be_.CopyToHost(flat, v.data());
    return v;
  };
  auto slice = [](const std::vector<float>& flat, const NamedTensor& n, std::string name) {
    CheckpointTensor t;
    t.name = std::move(name);
    t.shape = n.tensor.shape().dims();
    t.f32.assign(flat.begin() + n.offset, flat.begin() + n.offset + n.tensor.numel());
    return t;
  };
  const std::vector<float> params = host(model_->params());
  for (const auto& p : model_->named_params()) c.params.push_back(slice(params, p, p.name));
  const std::vector<float> buffers = host(model_->buffers());
  for (const auto& b : model_->named_buffers()) c.params.push_back(slice(buffers, b, b.name));
  for (const TensorSpec& spec : ParamSpecs()) {
    if (spec.dtype != CheckpointDType::kI64) continue;
    // torch counts training-mode forward calls: one per micro-step.
    CheckpointTensor t;
    t.name = spec.name;
    t.dtype = CheckpointDType::kI64;
    t.i64 = {step_ * accumulate_};
    c.params.push_back(std::move(t));
  }
  for (size_t k = 0; k < opt_->slot_names().size(); ++k) {
    const std::vector<float> slot = host(opt_->slots()[k]);
    for (const auto& p : model_->named_params()) {
      c.optimizer.push_back(slice(slot, p, p.name + "/" + opt_->slot_names()[k]));
    }
  }
  return c;
}

// Every rank calls it at the same step; only rank 0 copies the state (synchronously: the next
// step changes it) and hands it to the background writer.
void Trainer::SaveCheckpoint() {
  if (step_ == last_ckpt_step_) return;
  last_ckpt_step_ = step_;
  if (!ckpt_io_ || writer_ == nullptr) return;
  const auto t0 = Clock::now();
  Checkpoint c = Snapshot();
  copy_s_[step_] = Since(t0);
  writer_->Submit(std::move(c));
}

void Trainer::ReportWrites() {
  if (writer_ == nullptr) return;
  for (const CheckpointWriteStats& w : writer_->TakeCompleted()) {
    result_.last_checkpoint = w.path;
    const double copy_s = copy_s_[w.step];
    copy_s_.erase(w.step);
    for (const std::string& n : w.notices) Warn(n);
    Say(
        fmt::format("checkpoint {} ({:.1f} MB; host copy {:.1f} ms, written in {:.2f} s in the "
                    "background{})",
                    w.path, static_cast<double>(w.bytes) / 1e6, 1e3 * copy_s, w.seconds,
                    w.deleted.empty() ? "" : fmt::format("; {} older removed", w.deleted.size())));
    if (is_root()) {
      WriteMetrics({{"kind", "checkpoint"},
                    {"step", w.step},
                    {"time_s", RunTime()},
                    {"path", w.path},
                    {"bytes", w.bytes},
                    {"copy_ms", 1e3 * copy_s},
                    {"write_s", w.seconds}});
    }
  }
}

// At a step boundary, on every rank: did any rank get a stop signal, did rank 0's last write
// fail? One allreduce of two integers, so every rank takes the same decision at the same step.
bool Trainer::AgreeToStop() {
  int64_t v[2] = {g_stop_signal.load(), writer_ != nullptr && writer_->failed() ? 1 : 0};
  if (env_.hooks.stop_at_step >= 0 && step_ == env_.hooks.stop_at_step &&
      comm_.rank() == comm_.size() - 1) {
    v[0] = SIGUSR1;
  }
  comm_.AllReduceHost(v, 2, ReduceOp::kMax);
  if (v[1] != 0) {
    // Rank 0 rethrows the write error; every rank leaves with it (exit 6).
    RunAgreed(comm_, [&] {
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

TrainResult Trainer::Run() {
  RunAgreed(comm_, [&] { SetupData(); });
  SetupModelThatFits();
  // All ranks agree on what they are about to run.
  {
    const int64_t shape = sample_shape_.numel();
    int64_t v[6] = {train_->info().size,
                    -train_->info().size,
                    test_ ? test_->info().size : -1,
                    test_ ? -test_->info().size : 1,
                    shape,
                    -shape};
    comm_.AllReduceHost(v, 6, ReduceOp::kMax);
    // Every rank holds the same reduced values, so every rank reaches the same verdict.
    RunAgreed(comm_, [&] {
      DPT_CHECK_AS(DataError, v[0] == -v[1] && v[2] == -v[3] && v[4] == -v[5])
          << "the ranks see different datasets (train samples " << -v[1] << ".." << v[0]
          << ", test samples " << -v[3] << ".." << v[2] << ", values per sample " << -v[5] << ".."
          << v[4] << "); every rank must read the same files";
    });
  }
  InstallStopSignalHandlers();
  ckpt_dir_ = cfg_.run_dir + "/checkpoints";
  ckpt_io_ = comm_.rank() == 0 && (!env_.hooks.quiet || env_.hooks.quiet_checkpoints);
  // Rank 0 reads what to start from (a failure is agreed: exit 6 everywhere, nothing written).
  RunAgreed(comm_, [&] {
    if (ckpt_io_) LoadStartState();
  });
  comm_.BroadcastHost(&start_, sizeof start_, 0);
  RunAgreed(comm_, [&] {
    SetupRunDir();
    SetupCheckpointDir();
    SetupOutputs();
  });
  // Rank 0's parameters everywhere (identical by seed already; with a checkpoint, only rank 0
  // has read it).
  comm_.Broadcast(&model_->params(), 0);
  comm_.Broadcast(&model_->buffers(), 0);
  if (start_.kind == kResumed) {
    for (Tensor& slot : opt_->slots()) comm_.Broadcast(&slot, 0);
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
  session_start_step_ = step_;

  if (is_root()) {
    fmt::print(
        "dptrain: {} ranks x {} threads, model {} ({} parameters), {} train samples, "
        "global batch {} ({} per rank{}), {} steps/epoch, {} steps{}\n",
        world_, env_.threads,
        cfg_.model.name.empty() ? std::string("from layers") : cfg_.model.name,
        model_->num_params(), train_->info().size, cfg_.train.global_batch, local_batch_,
        accumulate_ > 1 ? fmt::format(" = {} x {} micro-steps", micro_, accumulate_) : "",
        steps_per_epoch_, total_steps_, cfg_.train.deterministic ? ", deterministic" : "");
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
      TrainStep(batch);
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
  RunAgreed(comm_, [&] {
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
  ReducePeakMemory();
  if (is_root()) {
    if (env_.interactive) fmt::print("\n");
    const double n = static_cast<double>(std::max<int64_t>(session_steps, 1));
    fmt::print("memory: peak per rank {} (min) / {} (mean) / {} (max); micro-batch {} x {}\n",
               FormatBytes(static_cast<size_t>(peak_min_)),
               FormatBytes(static_cast<size_t>(peak_mean_)),
               FormatBytes(static_cast<size_t>(peak_max_)), micro_, accumulate_);
    fmt::print(
        "done: {} steps in {:.1f}s, {:.0f} samples/s; per step: data wait {:.2f} ms, "
        "forward {:.2f} ms, backward {:.2f} ms, exposed communication {:.2f} ms, "
        "optimizer {:.2f} ms\n",
        session_steps, total, result_.samples_per_s, 1e3 * data_wait_s_ / n, 1e3 * fwd_s_ / n,
        1e3 * bwd_s_ / n, 1e3 * comm_s_ / n, 1e3 * opt_s_ / n);
    if (stopped) {
      fmt::print(
          "preempted by {} at step {}: resume with the same command (checkpoint.resume "
          "= \"auto\" continues from {})\n",
          SignalName(stop_signal_), step_,
          result_.last_checkpoint.empty() ? std::string("the last checkpoint")
                                          : result_.last_checkpoint);
    } else if (result_.test_accuracy >= 0) {
      fmt::print("final: test_accuracy {:.4f} test_loss {:.4f}\n", result_.test_accuracy,
                 result_.test_loss);
    } else if (result_.test_loss >= 0) {
      fmt::print("final: test_loss {:.6g}\n", result_.test_loss);
    }
    fmt::print("outputs: {}/metrics.jsonl, {}/config.toml, {}/\n", cfg_.run_dir, cfg_.run_dir,
               ckpt_dir_);
    std::fflush(stdout);
    WriteMetrics(
        {{"kind", "summary"},
         {"step", step_},
         {"epoch", result_.epochs},
         {"time_s", RunTime()},
         {"samples_per_s", result_.samples_per_s},
         {"stop_signal", stop_signal_},
         {"data_wait_ms", 1e3 * data_wait_s_ / n},
         {"forward_ms", 1e3 * fwd_s_ / n},
         {"backward_ms", 1e3 * bwd_s_ / n},
         {"exposed_comm_ms", 1e3 * comm_s_ / n},
         {"optimizer_ms", 1e3 * opt_s_ / n},
         {"micro_batch", micro_},
         {"accumulate", accumulate_},
         {"skipped_steps", skipped_steps_},
         {"peak_mem_bytes", {{"min", peak_min_}, {"mean", peak_mean_}, {"max", peak_max_}}}});
  }
  if (g_signal_count.load() > 1) {
    Say(
        fmt::format("dptrain: {} stop signals received on this rank; the first one counted, the "
                    "others changed nothing",
                    g_signal_count.load()));
  }
  // The signal is consumed; a later Train in this process starts clean.
  g_stop_signal.store(0);
  g_signal_count.store(0);
  return result_;
}

EvalResult Trainer::RunEval(const std::string& checkpoint) {
  eval_only_ = true;
  RunAgreed(comm_, [&] {
    SetupEvalData();
    SetupModel();
  });
  {
    int64_t v[2] = {test_->info().size, -test_->info().size};
    comm_.AllReduceHost(v, 2, ReduceOp::kMax);
    DPT_CHECK_AS(DataError, v[0] == -v[1])
        << "the ranks see test sets of different sizes; every rank must read the same files";
  }
  int64_t info[2] = {-1, 0};  // step, epoch of the checkpoint
  RunAgreed(comm_, [&] {
    if (comm_.rank() != 0) return;
    const Checkpoint c = ReadCheckpoint(checkpoint);
    for (const std::string& n : c.notices) {
      fmt::print("dptrain: notice: {}\n", n);
    }
    MatchCheckpoint(checkpoint, c, ParamSpecs(), nullptr);
    LoadTensors(c, false);
    if (c.has_state) {
      info[0] = c.state.step;
      info[1] = c.state.epoch;
    }
  });
  comm_.BroadcastHost(info, sizeof info, 0);
  comm_.Broadcast(&model_->params(), 0);
  comm_.Broadcast(&model_->buffers(), 0);
  const auto t0 = Clock::now();
  const EvalSums sums = RunTestSet();
  EvalResult r;
  r.samples = static_cast<int64_t>(sums.samples);
  r.step = info[0];
  r.test_loss = sums.loss / std::max(sums.samples, 1.0);
  r.test_accuracy = regression_ ? -1 : sums.correct / std::max(sums.samples, 1.0);
  if (comm_.rank() == 0 && !env_.hooks.quiet) {
    const std::string where =
        r.step >= 0 ? fmt::format(" (step {}, epoch {})", r.step, info[1]) : "";
    if (regression_) {
      fmt::print("eval {}{}: test_loss {:.6f} over {} samples on {} rank{} ({:.1f}s)\n", checkpoint,
                 where, r.test_loss, r.samples, world_, world_ == 1 ? "" : "s", Since(t0));
    } else {
      fmt::print(
          "eval {}{}: test_loss {:.6f} test_accuracy {:.4f} over {} samples on {} rank{} "
          "({:.1f}s)\n",
          checkpoint, where, r.test_loss, r.test_accuracy, r.samples, world_,
          world_ == 1 ? "" : "s", Since(t0));
    }
    std::fflush(stdout);
  }
  return r;
}

}  // namespace

void InstallStopSignalHandlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  // Fallback: a thread created before this call (MPI's progress threads when it runs after
  // MPI_Init) may still take a signal; the handler only sets the flag.
  struct sigaction sa {};
  sa.sa_handler = &OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (reads, MPI's polling) resume after the handler
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  // The signals are blocked in this thread and so in every thread it creates from now on
  // (OpenMP, oneDNN, loader, checkpoint writer) and taken synchronously by one thread that does
  // nothing else: a signal never interrupts a compute kernel or a library call. (Delivered
  // asynchronously under mpirun, a forwarded SIGUSR1 occasionally corrupted oneDNN's heap.)
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) OnStopSignal(sig);
    }
  }).detach();
}

TrainResult Train(const TrainConfig& cfg, const TrainEnv& env) {
  DPT_CHECK(env.comm != nullptr && env.backend != nullptr);
  Trainer t(cfg, env);
  return t.Run();
}

EvalResult EvaluateCheckpoint(const TrainConfig& cfg, const TrainEnv& env,
                              const std::string& checkpoint) {
  DPT_CHECK(env.comm != nullptr && env.backend != nullptr);
  Trainer t(cfg, env);
  return t.RunEval(checkpoint);
}

}  // namespace dptrain
