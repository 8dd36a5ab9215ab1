// SPDX-License-Identifier: Apache-2.0
// Evaluation (runtime/trainer_impl.h): one loop over the test set, split exactly once over the
// ranks, used by training's periodic evaluations and by `dptrain eval` (EvaluateCheckpoint).
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "runtime/agreement.h"
#include "runtime/trainer_impl.h"

namespace dptrain {

Trainer::EvalSums Trainer::RunTestSet() {
  const auto [begin, end] = EvalShard(test_->info().size, static_cast<int>(world_), comm_.rank());
  LoaderOptions o = loader_opts_;
  o.augment = Augment::kNone;
  EvalLoader loader(*test_, begin, end, micro_, o);
  HostBatch b;
  double sums[3] = {0, 0, 0};  // loss, correct, samples
  // Per class: the logits come to the host, argmax against the labels (the first maximum, as
  // the backends' correct count).
  const int64_t classes = regression_ ? 0 : cfg_.model.classes;
  std::vector<double> per_class(static_cast<size_t>(2 * classes), 0.0);  // samples, then hits
  std::vector<float> logits;
  ForwardContext ctx;
  ctx.training = false;
  while (loader.Next(&b)) {
    UploadBatch(b, 0, b.n, test_teacher_targets_);
    const Tensor x = x_dev_.Batch(b.n);
    const Tensor y = y_dev_.Batch(b.n);
    // A batch smaller than the micro-batch (the shard's last) needs backend plans of its own,
    // which may not fit beside the training step's: then the cached plans are dropped (they are
    // rebuilt on demand, identically) and the batch runs again. Rank-local: no collective runs
    // inside this loop, so no other rank is kept waiting.
    const Tensor* out = nullptr;
    for (int attempt = 0; out == nullptr; ++attempt) {
      try {
        out = &model_->Forward(x, ctx);
        loss_->Forward(*out, y, /*training=*/false);
      } catch (const OutOfMemory&) {
        if (attempt > 0) throw;
        out = nullptr;
        be_.ReleasePlans();
        be_.allocator().EmptyCache();
      }
    }
    float l = 0, c = 0;
    be_.CopyToHost(loss_->loss_sum(), &l);
    be_.CopyToHost(loss_->correct(), &c);
    const int64_t outputs_per_sample = out->numel() / b.n;
    sums[0] += regression_ ? l / static_cast<double>(outputs_per_sample) : l;
    sums[1] += c;
    sums[2] += static_cast<double>(b.n);
    if (classes > 0 && out->numel() == b.n * classes) {
      logits.resize(static_cast<size_t>(out->numel()));
      be_.CopyToHost(*out, logits.data());
      for (int64_t i = 0; i < b.n; ++i) {
        const float* row = logits.data() + i * classes;
        const int64_t pred = std::max_element(row, row + classes) - row;
        const int32_t label = b.labels[static_cast<size_t>(i)];
        per_class[static_cast<size_t>(label)] += 1;
        if (pred == label) per_class[static_cast<size_t>(classes + label)] += 1;
      }
    }
  }
  // Exact-once: every test sample is counted on exactly one rank.
  control_.AllReduceHost(sums, 3, ReduceOp::kSum);
  if (!per_class.empty()) {
    control_.AllReduceHost(per_class.data(), per_class.size(), ReduceOp::kSum);
  }
  EvalSums r{sums[0], sums[1], sums[2], {}, {}};
  if (!per_class.empty()) {
    r.class_samples.assign(per_class.begin(), per_class.begin() + classes);
    r.class_correct.assign(per_class.begin() + classes, per_class.end());
  }
  return r;
}

namespace {

// Accuracy per class, -1 where a class has no test samples.
std::vector<double> ClassAccuracy(const std::vector<double>& samples,
                                  const std::vector<double>& correct) {
  std::vector<double> acc(samples.size(), -1.0);
  for (size_t k = 0; k < samples.size(); ++k) {
    if (samples[k] > 0) acc[k] = correct[k] / samples[k];
  }
  return acc;
}

std::string ClassName(const std::vector<std::string>& names, size_t k) {
  return k < names.size() ? names[k] : std::to_string(k);
}

// The per-class table `dptrain eval` prints: every class up to 50, else the 25 worst.
void PrintClassTable(const std::vector<double>& acc, const std::vector<double>& samples,
                     const std::vector<std::string>& names) {
  std::vector<size_t> order(acc.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  const bool all = acc.size() <= 50;
  if (!all) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return acc[a] < acc[b]; });
    order.resize(25);
  }
  size_t width = 5;
  for (size_t k : order) width = std::max(width, ClassName(names, k).size());
  fmt::print("per class{}:\n  {:<{}} {:>9} {:>8}\n", all ? "" : " (the 25 lowest accuracies)",
             "class", width, "accuracy", "samples");
  for (size_t k : order) {
    fmt::print("  {:<{}} {:>9} {:>8}\n", ClassName(names, k), width,
               acc[k] < 0 ? std::string("-") : fmt::format("{:.4f}", acc[k]),
               static_cast<int64_t>(samples[k]));
  }
}

nlohmann::json ClassAccuracyJson(const std::vector<double>& acc,
                                 const std::vector<std::string>& names) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t k = 0; k < acc.size(); ++k) {
    j[ClassName(names, k)] = acc[k] < 0 ? nlohmann::json(nullptr) : nlohmann::json(acc[k]);
  }
  return j;
}

}  // namespace

void Trainer::Evaluate(int64_t epoch) {
  if (!test_) return;
  last_eval_step_ = step_;
  const auto t0 = Clock::now();
  const bool profiling = be_.profiling();  // train.profile measures training steps only
  be_.EnableProfiling(false);
  const EvalSums sums = RunTestSet();
  be_.EnableProfiling(profiling);
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
    if (!sums.class_samples.empty()) {
      j["class_accuracy"] = ClassAccuracyJson(ClassAccuracy(sums.class_samples, sums.class_correct),
                                              test_->info().class_names);
    }
    WriteMetrics(j);
  }
}

EvalResult Trainer::RunEval(const std::string& checkpoint) {
  eval_only_ = true;
  RunAgreed(control_, [&] {
    SetupData();
    SetupModel();
  });
  {
    int64_t v[2] = {test_->info().size, -test_->info().size};
    control_.AllReduceHost(v, 2, ReduceOp::kMax);
    DPT_CHECK_AS(DataError, v[0] == -v[1])
        << "the ranks see test sets of different sizes; every rank must read the same files";
  }
  int64_t info[2] = {-1, 0};  // step, epoch of the checkpoint
  RunAgreed(control_, [&] {
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
  control_.BroadcastHost(info, sizeof info, 0);
  comm_.Broadcast(&model_->params(), 0);
  comm_.Broadcast(&model_->buffers(), 0);
  const auto t0 = Clock::now();
  const EvalSums sums = RunTestSet();
  EvalResult r;
  r.samples = static_cast<int64_t>(sums.samples);
  r.step = info[0];
  r.test_loss = sums.loss / std::max(sums.samples, 1.0);
  r.test_accuracy = regression_ ? -1 : sums.correct / std::max(sums.samples, 1.0);
  r.class_accuracy = ClassAccuracy(sums.class_samples, sums.class_correct);
  r.class_names = test_->info().class_names;
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
      if (!r.class_accuracy.empty()) {
        PrintClassTable(r.class_accuracy, sums.class_samples, r.class_names);
      }
    }
    std::fflush(stdout);
  }
  return r;
}

EvalResult EvaluateCheckpoint(const TrainConfig& cfg, const TrainEnv& env,
                              const std::string& checkpoint) {
  DPT_CHECK(env.control != nullptr && env.comm != nullptr && env.backend != nullptr);
  Trainer t(cfg, env);
  return t.RunEval(checkpoint);
}

}  // namespace dptrain
