// SPDX-License-Identifier: Apache-2.0
// What a run reports (runtime/trainer_impl.h): the progress line, metrics.jsonl records, peak
// device memory over the ranks and the end-of-run summary.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

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
  // Peak device memory of each rank since the start: min, mean and max over ranks.
  const double peak = static_cast<double>(be_.allocator().stats().peak_in_use);
  double v[3] = {peak, -peak, peak};
  control_.AllReduceHost(v, 2, ReduceOp::kMax);
  control_.AllReduceHost(v + 2, 1, ReduceOp::kSum);
  peak_max_ = v[0];
  peak_min_ = -v[1];
  peak_mean_ = v[2] / static_cast<double>(world_);
}

void Trainer::LogStep(int64_t epoch, bool force) {
  if (win_steps_ == 0) return;
  if (!force && step_ % cfg_.train.log_every_steps != 0) return;
  FlushLossLog();
  double sums[2] = {win_loss_, static_cast<double>(win_samples_)};
  control_.AllReduceHost(sums, 2, ReduceOp::kSum);
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
}

}  // namespace dptrain
