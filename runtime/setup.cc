// SPDX-License-Identifier: Apache-2.0
// Trainer setup (runtime/trainer_impl.h): the datasets (files or generated), sampler and loader;
// the model, loss, optimizer, schedule and reducer; the out-of-memory micro-batch search of
// memory.auto_microbatch; run_dir and its outputs.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>

#include "core/error.h"
#include "datasets/synthetic.h"
#include "models/memory_plan.h"
#include "models/zoo/zoo.h"
#include "runtime/agreement.h"
#include "runtime/trainer_impl.h"

namespace dptrain {
namespace {

// train.no_weight_decay: the flat-buffer ranges (floats) of every bias ("bias") and of the
// batch-norm layers' weights and biases ("bn"), ascending and merged.
std::vector<std::pair<int64_t, int64_t>> NoDecayRanges(Model& m,
                                                       const std::vector<std::string>& groups) {
  const auto has = [&](const char* g) {
    return std::find(groups.begin(), groups.end(), g) != groups.end();
  };
  std::set<const void*> bn;
  if (has("bn")) {
    for (size_t i = 0; i < m.net().size(); ++i) {
      Layer& l = m.net().layer(i);
      if (l.type() != "batchnorm") continue;
      std::vector<ParamRef> refs;
      l.ListParams(&refs);
      for (const ParamRef& r : refs) bn.insert(r.value->raw());
    }
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const NamedTensor& p : m.named_params()) {
    const std::string& n = p.name;
    const bool bias = has("bias") && (n == "bias" || (n.size() > 5 && n.ends_with(".bias")));
    if (bias || bn.count(p.tensor.raw()) != 0) {
      ranges.emplace_back(p.offset, p.offset + p.tensor.numel());
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

}  // namespace

bool Trainer::IsRegression() const { return ResolveLoss(cfg_.model) == LossKind::kMse; }

std::unique_ptr<Dataset> Trainer::OpenData(const std::vector<std::string>& files,
                                           const Shape& synthetic_shape, int64_t synthetic_samples,
                                           uint64_t seed) const {
  const auto& m = cfg_.model;
  if (IsSynthetic(files)) {
    return MakeSynthetic(synthetic_shape, synthetic_samples, m.classes, regression_, seed);
  }
  OpenOptions o;
  o.classes = regression_ ? -1 : m.classes;
  o.cache = cfg_.data.cache;
  return OpenHdf5Datasets(files, o);
}

std::unique_ptr<Graph> Trainer::BuildNet() const {
  return dptrain::BuildNet(be_, cfg_.model, cfg_.memory, sample_shape_);
}

void Trainer::SetupData() {
  const auto& d = cfg_.data;
  regression_ = IsRegression();
  const uint64_t seed = static_cast<uint64_t>(cfg_.seed);
  DPT_CHECK_AS(ConfigError, !eval_only_ || !d.test.empty())
      << "dptrain eval needs a test set: data.test is empty in " << cfg_.source
      << " (set it, e.g. --set data.test=data/fmnist/test.h5)";
  if (!eval_only_) {
    train_ = OpenData(d.train, DefaultSampleShape(cfg_.model), d.synthetic_samples, seed);
  }
  // Generated test samples take the training samples' shape.
  if (!d.test.empty()) {
    test_ = OpenData(d.test, train_ ? train_->info().sample_shape : DefaultSampleShape(cfg_.model),
                     std::max<int64_t>(d.synthetic_samples / 4, 1), seed + 1);
  }
  const Dataset& first = train_ ? *train_ : *test_;
  // Regression targets: the fixed teacher on generated data, the label's value on a file.
  train_teacher_targets_ = IsSynthetic(d.train);
  test_teacher_targets_ = IsSynthetic(d.test);

  loader_opts_.workers = static_cast<int>(d.workers);
  loader_opts_.prefetch = std::max(2, 2 * static_cast<int>(d.workers));
  for (double v : d.mean) loader_opts_.mean.push_back(static_cast<float>(v));
  for (double v : d.std) loader_opts_.std.push_back(static_cast<float>(v));
  if (loader_opts_.mean.empty() && !first.info().mean.empty()) {
    loader_opts_.mean = first.info().mean;
    loader_opts_.std = first.info().std;
  }
  loader_opts_.augment = d.augment;
  loader_opts_.crop = d.crop;
  loader_opts_.seed = seed;
  // The model sees the loader's output: the stored samples, or their data.crop crops.
  for (const Dataset* ds : {train_.get(), test_.get()}) {
    if (ds != nullptr) ValidateLoaderOptions(loader_opts_, ds->info().sample_shape);
  }
  sample_shape_ = LoaderOutputShape(loader_opts_, first.info().sample_shape);
  if (regression_) teacher_ = TeacherWeights(sample_shape_.numel(), seed);
  if (train_ && test_) {
    const Shape a = LoaderOutputShape(loader_opts_, train_->info().sample_shape);
    const Shape b = LoaderOutputShape(loader_opts_, test_->info().sample_shape);
    DPT_CHECK_AS(DataError, a == b)
        << "data.test " << DescribeFiles(d.test) << " has samples of shape " << b.ToString()
        << " but data.train " << DescribeFiles(d.train) << " has " << a.ToString()
        << (d.crop > 0 ? " (after data.crop)" : "");
  }

  world_ = comm_.size();
  const int64_t g = cfg_.train.global_batch;
  if (eval_only_) {
    local_batch_ = std::max<int64_t>(1, g / world_);
    micro_ = local_batch_;
    return;
  }
  accumulate_ = cfg_.train.accumulate;
  // The sampler checks that the global batch divides over the ranks and fits the dataset.
  sampler_ = std::make_unique<Sampler>(train_->info().size, g, static_cast<int>(world_),
                                       comm_.rank(), seed, d.shuffle);
  local_batch_ = sampler_->local_batch();
  DPT_CHECK_AS(ConfigError, local_batch_ % accumulate_ == 0)
      << "train.accumulate = " << accumulate_ << " does not divide the per-rank batch "
      << local_batch_ << " (train.global_batch " << g << " / " << world_ << " ranks)";
  micro_ = local_batch_ / accumulate_;
  steps_per_epoch_ = sampler_->steps_per_epoch();
  int64_t by_epochs = 0;
  DPT_CHECK_AS(ConfigError,
               !__builtin_mul_overflow(cfg_.train.epochs, steps_per_epoch_, &by_epochs))
      << "train.epochs = " << cfg_.train.epochs << " of " << steps_per_epoch_
      << " steps each is more steps than a 64-bit count holds; use fewer epochs, or "
         "train.max_steps";
  total_steps_ = cfg_.train.max_steps > 0
                     ? (cfg_.train.epochs > 0 ? std::min(cfg_.train.max_steps, by_epochs)
                                              : cfg_.train.max_steps)
                     : by_epochs;
  loader_ = std::make_unique<TrainLoader>(*train_, *sampler_, loader_opts_);
}

FlatLayout Trainer::FlatLayoutFor() const {
  return ShardedFlatLayout(cfg_.dist.shard, world_, static_cast<size_t>(cfg_.dist.bucket_mb) << 20);
}

int64_t Trainer::NextMicroBatch(int64_t tried) const {
  for (int64_t d = tried / 2; d >= 1; --d) {
    if (local_batch_ % d == 0) return d;
  }
  return 0;
}

void Trainer::ShrinkMicroBatchMidRun(const std::string& oom) {
  const int64_t tried = micro_;
  int64_t failed_rank = oom.empty() ? comm_.size() : comm_.rank();
  control_.AllReduceHost(&failed_rank, 1, ReduceOp::kMin);
  // As at setup: Winograd's buffers go before the micro-batch does.
  const bool winograd_acts = WinogradCanGiveWay();
  const int64_t next = winograd_acts ? tried : NextMicroBatch(tried);
  if (next == 0) {
    detail::AgreeOnFailure(
        control_,
        oom + fmt::format("\nhint: memory.auto_microbatch cannot go below micro-batch {}: use "
                          "train.precision = \"bf16\" or \"fp16\"{}, or a smaller model",
                          tried, cfg_.memory.recompute ? "" : ", memory.recompute = true"),
        kExitOom, !oom.empty());
  }
  // The state the step started from, on the host: parameters, buffers (as they were before the
  // failed micro-steps), the optimizer's slots and counters, the loss scale.
  const auto host = [&](const Tensor& flat) {
    std::vector<float> v(static_cast<size_t>(flat.numel()));
    if (!v.empty()) be_.CopyToHost(flat, v.data());
    return v;
  };
  const std::vector<float> params = host(model_->params());
  const std::vector<float> buffers =
      host(buffers_at_step_.defined() ? buffers_at_step_ : model_->buffers());
  std::vector<std::vector<float>> slots;
  for (const Tensor& slot : opt_->slots()) slots.push_back(host(slot));
  const int64_t optimizer_steps = opt_->steps();
  const LossScalerState scale = scaler_->state();
  ReleaseModel();
  if (winograd_acts) {
    winograd_gave_way_at_ = tried;
    be_.SetWinograd(false);
    Warn(fmt::format(
        "train.winograd gives way: micro-batch {} ran out of memory on rank {} at step {}; "
        "convolutions run direct from here (same micro-batch, the step runs again)",
        tried, failed_rank, step_ + 1));
  } else {
    micro_ = next;
    accumulate_ = local_batch_ / micro_;
    Say(fmt::format(
        "memory.auto_microbatch: micro-batch {} ran out of memory on rank {} at step {}; going "
        "on with {} x {} micro-steps per step (global batch {} unchanged, the step runs again)",
        tried, failed_rank, step_ + 1, micro_, accumulate_, cfg_.train.global_batch));
  }
  SetupModelThatFits();
  const auto restore = [&](const std::vector<float>& v, Tensor* flat) {
    DPT_CHECK(static_cast<int64_t>(v.size()) == flat->numel());
    if (!v.empty()) be_.CopyFromHost(v.data(), flat);
  };
  restore(params, &model_->params());
  restore(buffers, &model_->buffers());
  for (size_t k = 0; k < slots.size(); ++k) restore(slots[k], &opt_->slots()[k]);
  opt_->set_steps(optimizer_steps);
  scaler_->set_state(scale);
}

void Trainer::ReleaseModel() {
  buffers_at_step_ = Tensor();
  reducer_.reset();
  opt_.reset();
  sharded_.reset();
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
      model.Setup(micro, cfg_.train.precision, FlatLayoutFor());
      plan = PlanMemory(model, StateSlots(cfg_.train.optimizer, cfg_.train.momentum),
                        regression_ ? LossKind::kMse : LossKind::kCrossEntropy, budget,
                        PlanSharding(cfg_.dist.shard, world_));
    } catch (const OutOfMemory&) {
    }
    be_.ReleasePlans();
    be_.allocator().EmptyCache();
    return plan;
  };
  int64_t fits = 0;
  if (const auto one = plan_at(1)) {
    fits = one->max_micro_batch;
    // Optimizer state is the largest item: sharding it is the advice that saves the most.
    const int64_t opt = one->optimizer();
    shard_advice_.clear();
    if (world_ > 1 && cfg_.dist.shard == ShardMode::kNone && opt > 0 &&
        opt >= std::max({one->params(), one->grads(), one->activations()})) {
      shard_advice_ = fmt::format(
          ", or set dist.shard = \"optimizer\" (optimizer state is the largest item, {} per "
          "rank; sharded over {} ranks {}) or \"gradients\" (the gradients too)",
          FormatBytes(static_cast<size_t>(opt)), world_,
          FormatBytes(static_cast<size_t>(opt / world_)));
    }
    if (one->fixed + one->per_sample * tried <= 4 * budget) {
      if (const auto at_tried = plan_at(tried)) fits = at_tried->max_micro_batch;
    }
  }
  be_.allocator().set_budget(limit);
  return fits;
}

bool Trainer::WinogradCanGiveWay() {
  // Winograd's transformed tiles cost memory and buy only speed: the direct convolutions (the
  // same maths up to rounding) at the same micro-batch come before a smaller one. Agreed, as
  // whether it acts depends on each host's CPU (and on the model: it may have no convolution
  // Winograd applies to).
  int64_t acts = winograd_gave_way_at_ == 0 && be_.WinogradPlanned() ? 1 : 0;
  control_.AllReduceHost(&acts, 1, ReduceOp::kMax);
  return acts != 0;
}

void Trainer::SetupModelThatFits() {
  for (;;) {
    std::string oom;
    RunAgreed(control_, [&] {
      try {
        SetupModel();
      } catch (const OutOfMemory& e) {
        oom = e.what();
      }
    });
    int64_t failed_rank = oom.empty() ? comm_.size() : comm_.rank();
    control_.AllReduceHost(&failed_rank, 1, ReduceOp::kMin);
    if (failed_rank == comm_.size()) break;
    if (WinogradCanGiveWay()) {
      winograd_gave_way_at_ = micro_;
      ReleaseModel();
      be_.SetWinograd(false);
      continue;
    }
    const int64_t tried = micro_;
    const int64_t next = NextMicroBatch(tried);
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
          fmt::format("use train.precision = \"bf16\" or \"fp16\"{}{}{}",
                      cfg_.memory.recompute ? "" : ", or set memory.recompute = true",
                      cfg_.memory.limit_bytes > 0 ? ", or raise memory.limit" : "", shard_advice_);
      // The estimate is then the direct convolutions'.
      const std::string direct = winograd_gave_way_at_ > 0
                                     ? " even with train.winograd given up (convolutions direct)"
                                     : "";
      const std::string advice =
          micro > 0
              ? fmt::format(
                    "\nhint: micro-batch {} per rank does not fit{}; micro-batch {} should fit "
                    "(estimate of `{}`): set train.accumulate = {} (the global batch and the "
                    "maths stay the same), or set memory.auto_microbatch = true to let dptrain "
                    "find it, or {}",
                    tried, direct, micro, plan_cmd, local_batch_ / micro, other_ways)
              : fmt::format(
                    "\nhint: micro-batch {} per rank does not fit{}, and by the estimate of `{}` "
                    "not even micro-batch 1 does: {}, or use a smaller model",
                    tried, direct, plan_cmd, other_ways);
      detail::AgreeOnFailure(control_, oom + advice, kExitOom, !oom.empty());
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
  const bool sharded = cfg_.dist.shard != ShardMode::kNone && world_ > 1;
  model_->Setup(micro_, cfg_.train.precision, FlatLayoutFor());
  model_->InitParams(static_cast<uint64_t>(cfg_.seed));
  const LossKind kind = regression_ ? LossKind::kMse : LossKind::kCrossEntropy;
  if (kind == LossKind::kMse) {
    DPT_CHECK_AS(ConfigError, cfg_.train.label_smoothing == 0)
        << "train.label_smoothing applies to the cross-entropy loss, but this model trains with "
           "mse";
    DPT_CHECK_AS(ConfigError, model_->output_shape().numel() == micro_)
        << "model.loss = \"mse\" regresses one value per sample, but the model outputs "
        << model_->output_shape().ToString() << "; end the model with a linear layer of out = 1";
  }
  if (kind == LossKind::kCrossEntropy) {
    DPT_CHECK_AS(ConfigError,
                 model_->output_shape().rank() == 2 && model_->output_shape()[1] == m.classes)
        << "the model's output " << model_->output_shape().ToString()
        << (m.onnx.empty() ? "" : " (model.onnx " + m.onnx + ")") << " does not match "
        << "model.classes = " << m.classes;
  }
  loss_ = std::make_unique<Loss>(be_, kind, model_->output_shape(),
                                 static_cast<float>(cfg_.train.label_smoothing));
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
  oc.no_decay = NoDecayRanges(*model_, cfg_.train.no_weight_decay);
  oc.lars_eta = cfg_.train.lars_eta;
  for (const NamedTensor& p : model_->named_params()) {
    oc.tensors.emplace_back(p.offset, p.offset + p.tensor.numel());
  }
  if (sharded) {
    sharded_ = std::make_unique<ShardedReducer>(be_, comm_, *model_, cfg_.dist.shard);
    if (sharded_->mode() != cfg_.dist.shard && !setup_noted_shard_) {
      setup_noted_shard_ = true;
      Say(kGradientsRunAsOptimizer);
    }
  }
  opt_ = std::make_unique<Optimizer>(be_, oc, model_->params(),
                                     sharded ? &sharded_->layout() : nullptr);
  sched_.kind = cfg_.train.schedule;
  sched_.base_lr = cfg_.train.lr;
  sched_.warmup_steps = cfg_.train.warmup_steps;
  sched_.total_steps = std::max<int64_t>(total_steps_, 1);
  sched_.step_size =
      cfg_.train.step_size > 0 ? cfg_.train.step_size : std::max<int64_t>(steps_per_epoch_, 1);
  sched_.gamma = cfg_.train.gamma;
  sched_.milestones.clear();
  for (double epochs : cfg_.train.milestones) {  // epochs -> optimizer steps
    const double step = epochs * static_cast<double>(std::max<int64_t>(steps_per_epoch_, 1));
    // A milestone past the run's end is never reached (and past 2^62 would not fit llround).
    sched_.milestones.push_back(step < static_cast<double>(sched_.total_steps) + 1
                                    ? std::llround(step)
                                    : sched_.total_steps + 1);
  }
  if (world_ > 1 && !sharded) {
    reducer_ = std::make_unique<Reducer>(comm_, model_->grads(),
                                         static_cast<size_t>(cfg_.dist.bucket_mb) << 20);
  }
  scaler_ = std::make_unique<LossScaler>(cfg_.train.precision == Precision::kF16 ||
                                         env_.hooks.loss_scaling);
  if (cfg_.memory.auto_microbatch && model_->buffers().numel() > 0) {
    buffers_at_step_ = be_.Empty(model_->buffers().shape(), model_->buffers().dtype(),
                                 "buffers at step start (memory.auto_microbatch)");
  }
}

void Trainer::SetupRunDir() {
  if (!is_root()) return;
  std::error_code ec;
  std::filesystem::create_directories(cfg_.run_dir, ec);
  DPT_CHECK_AS(IoError, !ec) << "run_dir '" << cfg_.run_dir
                             << "' cannot be created: " << ec.message();
  std::string why;
  if (!run_dir_lock_.Acquire(cfg_.run_dir, fmt::format("pid {} on {}", ::getpid(), env_.host),
                             &why)) {
    // A file system without locks (some network mounts): train, but say what is not checked.
    Warn(fmt::format("cannot lock {}: a second run with this run_dir would not be detected", why));
  }
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

}  // namespace dptrain
