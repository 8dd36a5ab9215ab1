// SPDX-License-Identifier: Apache-2.0
// What a run reports (runtime/trainer_impl.h): the progress line, metrics.jsonl records, peak
// device memory over the ranks and the end-of-run summary.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "core/backend_registry.h"
#include "core/error.h"
#include "runtime/agreement.h"
#include "runtime/signals.h"
#include "runtime/trainer_impl.h"

namespace dptrain {

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = std::llround(s);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

void Trainer::WriteMetrics(const nlohmann::json& j) {
  if (!metrics_.is_open()) return;
  metrics_ << j.dump() << "\n";
  metrics_.flush();
}

void Trainer::ReducePeakMemory() {
  // Peak device memory of each rank since the start: min, mean and max over ranks (rank 0).
  const double peak = static_cast<double>(be_.allocator().stats().peak_in_use);
  std::vector<double> all(comm_.rank() == 0 ? static_cast<size_t>(world_) : 0);
  control_.GatherHost(&peak, 1, all.data(), 0);
  if (all.empty()) return;
  peak_min_ = *std::min_element(all.begin(), all.end());
  peak_max_ = *std::max_element(all.begin(), all.end());
  peak_mean_ = std::accumulate(all.begin(), all.end(), 0.0) / static_cast<double>(world_);
}

namespace {

// Per rank and logging window, gathered to rank 0: milliseconds per step in each phase, then
// the rank's peak memory in bytes.
enum RankField { kDataWait, kForward, kBackward, kComm, kOptimizer, kPeak, kRankFields };
constexpr const char* kPhaseNames[] = {"data_wait", "forward", "backward", "exposed_comm",
                                       "optimizer"};
// Above this many ranks a step record carries the slowest rank only, not one value per rank.
constexpr int64_t kMaxRanksListed = 256;

// The phase split (mean over ranks, plus "other": the rest of the wall time per step) and the
// per-rank lists of a step record, from the gathered RankField values of every rank.
void AddRankTiming(const std::vector<double>& ranks, double window_s, int64_t steps,
                   nlohmann::json* j) {
  const int64_t world = static_cast<int64_t>(ranks.size()) / kRankFields;
  auto at = [&](int64_t r, int f) { return ranks[static_cast<size_t>(r * kRankFields + f)]; };
  nlohmann::json phases = nlohmann::json::object();
  double accounted = 0;
  for (int f = 0; f < 5; ++f) {
    double mean = 0;
    for (int64_t r = 0; r < world; ++r) mean += at(r, f) / static_cast<double>(world);
    phases[kPhaseNames[f]] = mean;
    accounted += mean;
  }
  const double wall_ms = 1e3 * window_s / static_cast<double>(std::max<int64_t>(steps, 1));
  phases["other"] = std::max(0.0, wall_ms - accounted);
  (*j)["phase_ms"] = phases;
  // A rank's own work per step (data wait + forward + backward + optimizer): the time it did not
  // spend waiting for the others. The largest is the straggler everyone else waits for.
  int64_t slowest = 0;
  double slowest_ms = -1;
  std::vector<double> data(static_cast<size_t>(world)), compute(data), comm(data), peak(data);
  for (int64_t r = 0; r < world; ++r) {
    const auto i = static_cast<size_t>(r);
    data[i] = at(r, kDataWait);
    compute[i] = at(r, kForward) + at(r, kBackward) + at(r, kOptimizer);
    comm[i] = at(r, kComm);
    peak[i] = at(r, kPeak);
    if (data[i] + compute[i] > slowest_ms) {
      slowest_ms = data[i] + compute[i];
      slowest = r;
    }
  }
  (*j)["slowest_rank"] = slowest;
  if (world <= kMaxRanksListed) {
    (*j)["rank_ms"] = {{"data_wait", data}, {"compute", compute}, {"exposed_comm", comm}};
    (*j)["rank_peak_mem_bytes"] = peak;
  }
}

}  // namespace

double Trainer::GradSquaredNorm() {
  double sq = 0;
  for (const Tensor& g : sharded_->OwnedGrads()) sq += be_.SumSquares(g);
  control_.AllReduceHost(&sq, 1, ReduceOp::kSum);
  return sq;
}

void Trainer::LogStep(int64_t epoch, bool force) {
  if (win_steps_ == 0) return;
  if (!force && step_ % cfg_.train.log_every_steps != 0) return;
  FlushLossLog();
  double sums[2] = {win_loss_, static_cast<double>(win_samples_)};
  control_.AllReduceHost(sums, 2, ReduceOp::kSum);
  // This window's time per step in each phase, and the peak memory, of every rank: one gather.
  const double totals[5] = {data_wait_s_, fwd_s_, bwd_s_, comm_s_, opt_s_};
  double mine[kRankFields];
  for (int i = 0; i < 5; ++i) {
    mine[i] = 1e3 * (totals[i] - win_phase_start_[i]) / static_cast<double>(win_steps_);
    win_phase_start_[i] = totals[i];
  }
  mine[kPeak] = static_cast<double>(be_.allocator().stats().peak_in_use);
  std::vector<double> ranks(comm_.rank() == 0 ? static_cast<size_t>(world_ * kRankFields) : 0);
  control_.GatherHost(mine, kRankFields, ranks.data(), 0);
  const double loss = sums[0] / std::max(sums[1], 1.0);
  const double dt = Since(win_start_);
  const double sps = sums[1] / std::max(dt, 1e-9);
  result_.last_loss = loss;
  result_.logged_losses.push_back(loss);
  if (!std::isfinite(loss) && !scaler_->enabled()) {
    // The loss was summed over ranks: every rank sees it and stops alike.
    throw AgreedError(RankTag() + fmt::format("the training loss is {} at step {} (epoch {}); "
                                              "hint: lower train.lr, check the data for NaN/Inf, "
                                              "or use a warm-up (train.warmup_steps)",
                                              loss, step_, epoch + 1),
                      kExitData);
  }
  if (!ranks.empty()) {
    auto at = [&](int64_t r, int f) { return ranks[static_cast<size_t>(r * kRankFields + f)]; };
    peak_min_ = peak_max_ = at(0, kPeak);
    peak_mean_ = 0;
    for (int64_t r = 0; r < world_; ++r) {
      peak_min_ = std::min(peak_min_, at(r, kPeak));
      peak_max_ = std::max(peak_max_, at(r, kPeak));
      peak_mean_ += at(r, kPeak) / static_cast<double>(world_);
    }
  }
  // The squared norm of the last step's summed gradient: rank 0's copy holds all of it, or
  // with dist.shard every rank its chunks (one more allreduce).
  double grad_sq = 0;
  if (grad_sq_saved_) {
    grad_sq = *grad_sq_saved_;
  } else if (sharded_) {
    grad_sq = GradSquaredNorm();
  } else if (is_root()) {
    grad_sq = be_.SumSquares(model_->grads());
  }
  grad_sq_saved_.reset();
  // Training that waits for its data says so: the slowest rank's wait, as a share of the step.
  std::string waiting;
  if (!ranks.empty()) {
    double wait_ms = 0;
    for (int64_t r = 0; r < world_; ++r) {
      wait_ms = std::max(wait_ms, ranks[static_cast<size_t>(r * kRankFields + kDataWait)]);
    }
    const double step_ms = 1e3 * dt / static_cast<double>(win_steps_);
    if (wait_ms > 0.1 * step_ms) {
      waiting = fmt::format(" (waiting for data {:.0f}% of the step: raise data.workers)",
                            100 * std::min(wait_ms / step_ms, 1.0));
    }
  }
  if (is_root()) {
    // ETA from this session's pace (a resumed run starts its clock again).
    const double session = Since(run_start_);
    const int64_t done = step_ - session_start_step_;
    const double eta =
        done > 0 ? session / static_cast<double>(done) * static_cast<double>(total_steps_ - step_)
                 : 0;
    const std::string line = fmt::format(
        "epoch {}/{} step {}/{} loss {:.4g} lr {:.4g} {:.0f} samples/s eta {}{}", epoch + 1,
        std::max<int64_t>(cfg_.train.epochs, (total_steps_ + steps_per_epoch_ - 1) /
                                                 std::max<int64_t>(steps_per_epoch_, 1)),
        step_, total_steps_, loss, lr_, sps, FormatDuration(eta), waiting);
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
      if (!skipped_in_window_.empty()) j["skipped_at"] = skipped_in_window_;
    }
    // The last step's averaged gradient (unscaled): every rank holds the same after the
    // allreduce, so rank 0 measures it alone. Not finite (JSON null) on a skipped step.
    const double divisor = static_cast<double>(world_ * accumulate_) * scaler_->scale();
    j["grad_norm"] = std::sqrt(grad_sq) / divisor;
    AddRankTiming(ranks, dt, win_steps_, &j);
    WriteMetrics(j);
  }
  skipped_in_window_.clear();
  win_loss_ = 0;
  win_samples_ = 0;
  win_steps_ = 0;
  win_start_ = Clock::now();
}

// Collective (the peak memory over ranks); rank 0 prints and writes the summary record.
void Trainer::PrintSummary(bool stopped, int64_t session_steps, double total) {
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
    if (loader_ && loader_->SamplesPerThreadSecond() > 0) {
      // What the loader threads can make against what the step used, on rank 0.
      const int threads = std::max(1, loader_opts_.workers);
      const double per_thread = loader_->SamplesPerThreadSecond();
      fmt::print(
          "data: the loader makes {:.0f} samples/s per thread ({} x {:.0f} = {:.0f} samples/s "
          "on rank 0{}); training consumed {:.0f} samples/s per rank\n",
          per_thread, threads, per_thread, threads * per_thread,
          loader_opts_.workers == 0 ? ", in the training thread: data.workers = 0" : "",
          result_.samples_per_s / static_cast<double>(world_));
    }
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
    nlohmann::json j{
        {"kind", "summary"},
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
        {"peak_mem_bytes", {{"min", peak_min_}, {"mean", peak_mean_}, {"max", peak_max_}}},
        {"status", stopped ? "preempted" : "finished"}};
    if (result_.test_loss >= 0) j["test_loss"] = result_.test_loss;
    if (result_.test_accuracy >= 0) j["test_accuracy"] = result_.test_accuracy;
    WriteMetrics(j);
  }
}

void Trainer::PrintProfile() {
  if (!is_root()) return;
  const std::vector<OpStat> ops = be_.Profile();
  const double steps = static_cast<double>(std::max<int64_t>(profiled_steps_, 1));
  double op_s = 0;
  for (const OpStat& o : ops) op_s += o.seconds;
  const double step_ms = 1e3 * profiled_s_ / steps;
  // Per op kind, then the graph nodes' ops that took the most time.
  std::map<std::string, OpStat> kinds;
  for (const OpStat& o : ops) {
    OpStat& k = kinds[o.name];
    k.name = o.name;
    k.calls += o.calls;
    k.seconds += o.seconds;
    k.flops += o.flops;
  }
  std::vector<OpStat> by_kind;
  by_kind.reserve(kinds.size());
  for (const auto& [name, k] : kinds) by_kind.push_back(k);
  std::sort(by_kind.begin(), by_kind.end(),
            [](const OpStat& a, const OpStat& b) { return a.seconds > b.seconds; });
  auto pct = [&](double s) { return op_s > 0 ? 100.0 * s / op_s : 0.0; };
  // One table row, without the blank GFLOP/s column's padding.
  auto print_row = [](std::string line) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
  };
  // GFLOP/s of the ops that count their arithmetic (convolutions, linear layers), else 0.
  auto gflop_per_s = [](const OpStat& o) {
    return o.flops > 0 && o.seconds > 0 ? o.flops / o.seconds * 1e-9 : 0.0;
  };
  auto gflops = [&](const OpStat& o) {  // the table's column: blank where not counted
    const double g = gflop_per_s(o);
    return g > 0 ? fmt::format("{:.1f}", g) : std::string();
  };
  // On a device stream the ops are timed there and the step is not slowed by the profile: the
  // step against the ops' sum is how much of the step the device is busy.
  const bool on_device = be_.TimesOpsOnDevice();
  const double ops_ms = 1e3 * op_s / steps;
  if (on_device) {
    fmt::print(
        "profile (rank 0, {} steps after the first; ops timed on the device stream: {:.2f} ms per "
        "step, {:.2f} ms of it in ops, step / ops {:.2f}x):\n",
        profiled_steps_, step_ms, ops_ms, ops_ms > 0 ? step_ms / ops_ms : 0.0);
  } else {
    fmt::print(
        "profile (rank 0, {} steps after the first; every op synchronised: {:.2f} ms per step, "
        "{:.2f} ms of it in ops):\n",
        profiled_steps_, step_ms, ops_ms);
  }
  fmt::print("  {:<24} {:>10} {:>10} {:>7} {:>9}\n", "op", "calls/step", "ms/step", "%", "GFLOP/s");
  for (const OpStat& k : by_kind) {
    print_row(fmt::format("  {:<24} {:>10.1f} {:>10.3f} {:>6.1f}% {:>9}", k.name,
                          static_cast<double>(k.calls) / steps, 1e3 * k.seconds / steps,
                          pct(k.seconds), gflops(k)));
  }
  size_t width = 4;
  const size_t top = std::min<size_t>(ops.size(), 20);
  for (size_t i = 0; i < top; ++i) width = std::max(width, ops[i].node.size());
  fmt::print("  the {} slowest (node, op):\n  {:<{}} {:<24} {:>10} {:>7} {:>9}\n", top, "node",
             width, "op", "ms/step", "%", "GFLOP/s");
  for (size_t i = 0; i < top; ++i) {
    const OpStat& o = ops[i];
    print_row(fmt::format("  {:<{}} {:<24} {:>10.3f} {:>6.1f}% {:>9}",
                          o.node.empty() ? "-" : o.node, width, o.name, 1e3 * o.seconds / steps,
                          pct(o.seconds), gflops(o)));
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const OpStat& o : ops) {
    nlohmann::json row{{"node", o.node},
                       {"op", o.name},
                       {"calls_per_step", static_cast<double>(o.calls) / steps},
                       {"ms_per_step", 1e3 * o.seconds / steps}};
    if (gflop_per_s(o) > 0) row["gflop_per_s"] = gflop_per_s(o);
    rows.push_back(std::move(row));
  }
  WriteMetrics({{"kind", "profile"},
                {"step", step_},
                {"epoch", result_.epochs},  // as the summary record before it
                {"time_s", RunTime()},
                {"steps", profiled_steps_},
                {"step_ms", step_ms},
                {"ops_ms", ops_ms},
                {"ops_timed", on_device ? "device" : "host"},
                {"ops", rows}});
  std::fflush(stdout);
}

void Trainer::WriteStartRecord() {
  // "host device" of every rank (the device's name when it has one: a GPU's model).
  const auto dev = BackendDevice(be_);
  const std::string mine = env_.host + " " + (dev ? be_.name() + ": " + dev->name : be_.name());
  const std::vector<std::string> devices = control_.AllGatherStrings(mine);
  if (!is_root()) return;
  std::set<std::string> hosts;
  for (const auto& d : devices) hosts.insert(d.substr(0, d.find(' ')));
  const TrainConfig& c = cfg_;
  WriteMetrics({{"kind", "start"},
                {"step", step_},
                {"epoch", epoch_ + 1},
                {"time_s", elapsed_offset_},
                {"version", DPTRAIN_VERSION},
                {"model", c.model.name.empty() ? std::string("layers") : c.model.name},
                {"params", model_->num_params()},
                {"world_size", world_},
                {"hosts", hosts.size()},
                {"devices", devices},
                {"threads", env_.threads},
                {"global_batch", c.train.global_batch},
                {"micro_batch", micro_},
                {"accumulate", accumulate_},
                {"precision", ConfigName(c.train.precision)},
                {"optimizer", ConfigName(c.train.optimizer)},
                {"train_samples", train_->info().size},
                {"test_samples", test_ ? test_->info().size : 0},
                {"steps_per_epoch", steps_per_epoch_},
                {"total_steps", total_steps_},
                {"log_every_steps", c.train.log_every_steps},
                {"resumed", start_.kind == kResumed}});
}

void Trainer::RecordError(const std::string& message, int exit_code) noexcept {
  if (!is_root() || !metrics_.is_open()) return;
  try {
    const double t = run_start_ == Clock::time_point{} ? elapsed_offset_ : RunTime();
    WriteMetrics({{"kind", "error"},
                  {"step", step_},
                  {"epoch", epoch_ + 1},
                  {"time_s", t},
                  {"exit_code", exit_code},
                  {"message", message}});
  } catch (...) {  // NOLINT(bugprone-empty-catch): the error being reported matters more
  }
}

}  // namespace dptrain
