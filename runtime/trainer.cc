// SPDX-License-Identifier: Apache-2.0
// The training loop. One optimizer step = `accumulate` micro-steps over slices of this rank's
// share of the global batch; only the last micro-step's backward reduces gradients (bucketed,
// overlapped). Metrics are summed over ranks before rank 0 reports them.
#include "runtime/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "datasets/sampler.h"
#include "models/loss.h"
#include "models/model.h"
#include "models/zoo/zoo.h"
#include "runtime/comm/reducer.h"
#include "runtime/error.h"
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

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Precision ParsePrecision(const std::string& p) {
  if (p == "bf16") return Precision::kBF16;
  if (p == "fp16") return Precision::kF16;
  return Precision::kF32;
}

// Synthetic data: deterministic from the seed, identical on every rank.
//  - regression (the `linear` model): x uniform in [-1, 1]^F; the target is a fixed teacher
//    y = w*.x + b* computed in the trainer (the dataset's labels are unused);
//  - classification: uniform pixels, labels from a fixed random linear teacher (learnable).
struct SplitMix {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float Uniform() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
};

std::vector<float> TeacherWeights(int64_t features, uint64_t seed) {
  SplitMix rng{seed ^ 0x7EAC4E2ull};
  std::vector<float> w(static_cast<size_t>(features) + 1);
  for (auto& v : w) v = 2 * rng.Uniform() - 1;
  return w;  // last entry: bias
}

std::unique_ptr<Dataset> MakeSynthetic(const Shape& sample, int64_t n, int64_t classes,
                                       bool regression, uint64_t seed) {
  const int64_t per = sample.numel();
  std::vector<float> images(static_cast<size_t>(n * per));
  std::vector<int32_t> labels(static_cast<size_t>(n), 0);
  SplitMix rng{seed};
  for (auto& v : images) v = regression ? 2 * rng.Uniform() - 1 : rng.Uniform();
  if (!regression) {
    // Labels from a random linear teacher over the pixels.
    std::vector<float> w(static_cast<size_t>(per * classes));
    SplitMix t{seed ^ 0xC1A55ull};
    for (auto& v : w) v = 2 * t.Uniform() - 1;
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
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const TrainEnv& env)
      : cfg_(cfg), env_(env), comm_(*env.comm), be_(*env.backend) {}

  TrainResult Run();

 private:
  void SetupData();
  void SetupModel();
  void SetupOutputs();
  void TrainStep(const HostBatch& batch);
  void Evaluate(int64_t epoch);
  void LogStep(int64_t epoch, bool force);
  void WriteMetrics(const nlohmann::json& j);
  void UploadBatch(const HostBatch& b, int64_t begin, int64_t n);
  bool is_root() const { return comm_.rank() == 0 && !env_.quiet; }

  const TrainConfig& cfg_;
  const TrainEnv& env_;
  Communicator& comm_;
  Backend& be_;

  bool regression_ = false;
  std::vector<float> teacher_;
  std::unique_ptr<Dataset> train_, test_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<TrainLoader> loader_;
  LoaderOptions loader_opts_;
  int64_t world_ = 1, local_batch_ = 0, micro_ = 0, accumulate_ = 1;
  int64_t steps_per_epoch_ = 0, total_steps_ = 0;

  std::unique_ptr<Model> model_;
  std::unique_ptr<Loss> loss_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<Reducer> reducer_;
  ScheduleConfig sched_;
  Tensor x_dev_, y_dev_;
  std::vector<float> targets_host_;

  int64_t step_ = 0;  // optimizer steps done
  int64_t last_eval_step_ = -1;
  double lr_ = 0;
  // Logging window (local sums; reduced over ranks when logged).
  double win_loss_ = 0;
  int64_t win_samples_ = 0, win_steps_ = 0;
  Clock::time_point win_start_, run_start_;
  double data_wait_s_ = 0, fwd_s_ = 0, bwd_s_ = 0, comm_s_ = 0, opt_s_ = 0;
  TrainResult result_;
  std::ofstream metrics_;
};

void Trainer::SetupData() {
  const auto& d = cfg_.data;
  const auto& m = cfg_.model;
  const bool zoo = !m.name.empty();
  regression_ =
      m.loss == "mse" || (m.loss == "auto" && zoo && DefaultLoss(m.name) == LossKind::kMse);
  const Shape synthetic_shape = zoo ? DefaultInputShape(m.name) : Shape{1, 28, 28};
  const uint64_t seed = static_cast<uint64_t>(cfg_.seed);
  if (d.train == "synthetic") {
    train_ = MakeSynthetic(synthetic_shape, d.synthetic_samples, m.classes, regression_, seed);
  } else {
    OpenOptions o;
    o.classes = regression_ ? -1 : m.classes;
    o.cache = d.cache;
    train_ = OpenHdf5Dataset(d.train, o);
  }
  if (d.test == "synthetic") {
    test_ = MakeSynthetic(synthetic_shape, std::max<int64_t>(d.synthetic_samples / 4, 1), m.classes,
                          regression_, seed + 1);
  } else if (!d.test.empty()) {
    OpenOptions o;
    o.classes = regression_ ? -1 : m.classes;
    o.cache = d.cache;
    test_ = OpenHdf5Dataset(d.test, o);
    DPT_CHECK_AS(DataError, test_->info().sample_shape == train_->info().sample_shape)
        << "data.test " << d.test << " has samples of shape "
        << test_->info().sample_shape.ToString() << " but data.train " << d.train << " has "
        << train_->info().sample_shape.ToString();
  }
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

void Trainer::SetupModel() {
  const auto& m = cfg_.model;
  auto net =
      m.name.empty() ? BuildFromLayers(be_, m.layers) : BuildZooModel(be_, m.name, m.classes);
  model_ = std::make_unique<Model>(be_, std::move(net), train_->info().sample_shape);
  model_->Setup(micro_, ParsePrecision(cfg_.train.precision));
  model_->InitParams(static_cast<uint64_t>(cfg_.seed));
  const LossKind kind = regression_ ? LossKind::kMse : LossKind::kCrossEntropy;
  if (kind == LossKind::kCrossEntropy) {
    DPT_CHECK_AS(ConfigError,
                 model_->output_shape().rank() == 2 && model_->output_shape()[1] == m.classes)
        << "the model's output " << model_->output_shape().ToString() << " does not match "
        << "model.classes = " << m.classes;
  }
  loss_ = std::make_unique<Loss>(be_, kind, model_->output_shape());
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

  Shape xs = model_->input_shape();
  std::vector<int64_t> dims{micro_};
  for (int64_t v : xs.dims()) dims.push_back(v);
  x_dev_ = be_.Empty(Shape(dims), DType::kF32, "input batch");
  if (regression_) {
    y_dev_ = be_.Empty(model_->output_shape().WithBatch(micro_), DType::kF32, "target batch");
  } else {
    y_dev_ = be_.Empty(Shape{micro_}, DType::kI32, "label batch");
  }
  if (world_ > 1) {
    reducer_ = std::make_unique<Reducer>(comm_, model_->grads(),
                                         static_cast<size_t>(cfg_.dist.bucket_mb) << 20);
  }
}

void Trainer::SetupOutputs() {
  if (!is_root()) return;
  std::error_code ec;
  std::filesystem::create_directories(cfg_.run_dir, ec);
  DPT_CHECK_AS(IoError, !ec) << "run_dir '" << cfg_.run_dir
                             << "' cannot be created: " << ec.message();
  {
    std::ofstream f(cfg_.run_dir + "/config.toml");
    f << env_.resolved_toml;
    DPT_CHECK_AS(IoError, f.good()) << "cannot write " << cfg_.run_dir << "/config.toml";
  }
  metrics_.open(cfg_.run_dir + "/metrics.jsonl", std::ios::trunc);
  DPT_CHECK_AS(IoError, metrics_.good()) << "cannot write " << cfg_.run_dir << "/metrics.jsonl";
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
  if (regression_) {
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
    win_loss_ += regression_ ? loss_sum / static_cast<double>(out.numel() / micro_) : loss_sum;
    const Tensor& dout = loss_->Backward(out, y, micro_);
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
  opt_->Step(&model_->params(), model_->grads(), static_cast<float>(lr_),
             1.f / static_cast<float>(world_ * accumulate_));
  be_.Synchronize();
  opt_s_ += Since(t0);
  ++step_;
  win_samples_ += local_batch_;
  ++win_steps_;
}

void Trainer::LogStep(int64_t epoch, bool force) {
  if (win_steps_ == 0) return;
  if (!force && step_ % cfg_.train.log_every_steps != 0) return;
  double sums[2] = {win_loss_, static_cast<double>(win_samples_)};
  comm_.AllReduceHost(sums, 2, ReduceOp::kSum);
  const double loss = sums[0] / std::max(sums[1], 1.0);
  const double dt = Since(win_start_);
  const double sps = sums[1] / std::max(dt, 1e-9);
  result_.last_loss = loss;
  if (!std::isfinite(loss)) {
    DPT_THROW(DataError) << "the training loss is " << loss << " at step " << step_ << " (epoch "
                         << epoch + 1 << "); hint: lower train.lr, check the data "
                         << "for NaN/Inf, or use a warm-up (train.warmup_steps)";
  }
  if (is_root()) {
    const double elapsed = Since(run_start_);
    const double eta =
        step_ > 0 ? elapsed / static_cast<double>(step_) * static_cast<double>(total_steps_ - step_)
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
    WriteMetrics({{"kind", "step"},
                  {"step", step_},
                  {"epoch", epoch + 1},
                  {"time_s", elapsed},
                  {"loss", loss},
                  {"lr", lr_},
                  {"samples_per_s", sps}});
  }
  win_loss_ = 0;
  win_samples_ = 0;
  win_steps_ = 0;
  win_start_ = Clock::now();
}

void Trainer::Evaluate(int64_t epoch) {
  if (!test_) return;
  last_eval_step_ = step_;
  const auto t0 = Clock::now();
  const auto [begin, end] = EvalShard(test_->info().size, static_cast<int>(world_), comm_.rank());
  LoaderOptions o = loader_opts_;
  o.augment = "none";
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
    sums[0] += regression_ ? l / static_cast<double>(out.numel() / b.n) : l;
    sums[1] += c;
    sums[2] += static_cast<double>(b.n);
  }
  // Exact-once: every test sample is counted on exactly one rank.
  comm_.AllReduceHost(sums, 3, ReduceOp::kSum);
  result_.test_loss = sums[0] / std::max(sums[2], 1.0);
  result_.test_accuracy = regression_ ? -1 : sums[1] / std::max(sums[2], 1.0);
  if (is_root()) {
    if (env_.interactive) fmt::print("\n");
    if (regression_) {
      fmt::print("eval epoch {} step {}: test_loss {:.6f} over {} samples ({:.1f}s)\n", epoch + 1,
                 step_, result_.test_loss, static_cast<int64_t>(sums[2]), Since(t0));
    } else {
      fmt::print(
          "eval epoch {} step {}: test_loss {:.4f} test_accuracy {:.4f} over {} samples "
          "({:.1f}s)\n",
          epoch + 1, step_, result_.test_loss, result_.test_accuracy, static_cast<int64_t>(sums[2]),
          Since(t0));
    }
    std::fflush(stdout);
    nlohmann::json j{{"kind", "eval"},
                     {"step", step_},
                     {"epoch", epoch + 1},
                     {"time_s", Since(run_start_)},
                     {"test_loss", result_.test_loss},
                     {"test_samples", static_cast<int64_t>(sums[2])}};
    if (!regression_) j["test_accuracy"] = result_.test_accuracy;
    WriteMetrics(j);
  }
}

TrainResult Trainer::Run() {
  RunAgreed(comm_, [&] {
    SetupData();
    SetupModel();
  });
  // All ranks agree on what they are about to run.
  {
    int64_t v[4] = {train_->info().size, -train_->info().size, test_ ? test_->info().size : -1,
                    test_ ? -test_->info().size : 1};
    comm_.AllReduceHost(v, 4, ReduceOp::kMax);
    DPT_CHECK_AS(DataError, v[0] == -v[1] && v[2] == -v[3])
        << "the ranks see datasets of different sizes (train " << -v[1] << ".." << v[0]
        << "); every rank must read the same files";
  }
  RunAgreed(comm_, [&] { SetupOutputs(); });
  // Rank 0's initial parameters everywhere (identical by seed already; this makes it a rule).
  comm_.Broadcast(&model_->params(), 0);
  comm_.Broadcast(&model_->buffers(), 0);

  if (is_root()) {
    fmt::print(
        "dptrain: {} ranks x {} threads, model {} ({} parameters), {} train samples, "
        "global batch {} ({} per rank{}), {} steps/epoch, {} steps\n",
        world_, env_.threads,
        cfg_.model.name.empty() ? std::string("from layers") : cfg_.model.name,
        model_->num_params(), train_->info().size, cfg_.train.global_batch, local_batch_,
        accumulate_ > 1 ? fmt::format(" = {} x {} micro-steps", micro_, accumulate_) : "",
        steps_per_epoch_, total_steps_);
    std::fflush(stdout);
  }

  run_start_ = Clock::now();
  win_start_ = run_start_;
  int64_t epoch = 0;
  while (step_ < total_steps_) {
    const int64_t epoch_start = step_;
    loader_->Start(epoch, 0);
    while (loader_->HasNext() && step_ < total_steps_) {
      auto t0 = Clock::now();
      HostBatch batch = loader_->Next();
      data_wait_s_ += Since(t0);
      TrainStep(batch);
      LogStep(epoch, false);
    }
    loader_->Stop();
    const bool epoch_done = step_ - epoch_start == steps_per_epoch_;
    LogStep(epoch, true);
    if (epoch_done) {
      result_.epochs = epoch + 1;
      if (is_root()) {
        WriteMetrics({{"kind", "epoch"},
                      {"step", step_},
                      {"epoch", epoch + 1},
                      {"time_s", Since(run_start_)},
                      {"loss", result_.last_loss}});
      }
      if (cfg_.train.eval_every_epochs > 0 && (epoch + 1) % cfg_.train.eval_every_epochs == 0) {
        Evaluate(epoch);
      }
    }
    ++epoch;
  }
  const double total = Since(run_start_);
  result_.steps = step_;
  if (env_.keep_final_params) {
    for (const auto& p : model_->named_params()) {
      std::vector<float> v(static_cast<size_t>(p.tensor.numel()));
      be_.CopyToHost(p.tensor, v.data());
      result_.final_params.emplace_back(p.name, std::move(v));
    }
  }
  result_.samples_per_s =
      static_cast<double>(step_ * cfg_.train.global_batch) / std::max(total, 1e-9);
  // Final evaluation if the last epoch's did not run.
  if (test_ && step_ != last_eval_step_) Evaluate(epoch - 1);
  if (is_root()) {
    if (env_.interactive) fmt::print("\n");
    const double n = static_cast<double>(std::max<int64_t>(step_, 1));
    fmt::print(
        "done: {} steps in {:.1f}s, {:.0f} samples/s; per step: data wait {:.2f} ms, "
        "forward {:.2f} ms, backward {:.2f} ms, exposed communication {:.2f} ms, "
        "optimizer {:.2f} ms\n",
        step_, total, result_.samples_per_s, 1e3 * data_wait_s_ / n, 1e3 * fwd_s_ / n,
        1e3 * bwd_s_ / n, 1e3 * comm_s_ / n, 1e3 * opt_s_ / n);
    if (result_.test_accuracy >= 0) {
      fmt::print("final: test_accuracy {:.4f} test_loss {:.4f}\n", result_.test_accuracy,
                 result_.test_loss);
    } else if (result_.test_loss >= 0) {
      fmt::print("final: test_loss {:.6g}\n", result_.test_loss);
    }
    fmt::print("outputs: {}/metrics.jsonl, {}/config.toml\n", cfg_.run_dir, cfg_.run_dir);
    std::fflush(stdout);
    WriteMetrics({{"kind", "summary"},
                  {"step", step_},
                  {"epoch", result_.epochs},
                  {"time_s", total},
                  {"samples_per_s", result_.samples_per_s},
                  {"data_wait_ms", 1e3 * data_wait_s_ / n},
                  {"forward_ms", 1e3 * fwd_s_ / n},
                  {"backward_ms", 1e3 * bwd_s_ / n},
                  {"exposed_comm_ms", 1e3 * comm_s_ / n},
                  {"optimizer_ms", 1e3 * opt_s_ / n}});
  }
  return result_;
}

}  // namespace

TrainResult Train(const TrainConfig& cfg, const TrainEnv& env) {
  DPT_CHECK(env.comm != nullptr && env.backend != nullptr);
  Trainer t(cfg, env);
  return t.Run();
}

}  // namespace dptrain
