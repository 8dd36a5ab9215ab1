// SPDX-License-Identifier: Apache-2.0
// What `dptrain report` knows about one run directory: the records of its metrics.jsonl (as far
// as they can be read), its config.toml and the last error a log file beside them recorded.
// Reading never throws for bad content: every line that cannot be used is counted in `notes`,
// so a report of a running, failed or older run still renders what is there.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace dptrain::report {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Phases of a step, in the order of a step record's "phase_ms" (docs/design.md section 5).
enum Phase { kDataWait, kForward, kBackward, kExposedComm, kOptimizer, kOther, kPhases };
extern const std::array<const char*, kPhases> kPhaseKeys;    // "data_wait", ...
extern const std::array<const char*, kPhases> kPhaseLabels;  // "data wait", ...

// One "step" record (a logging window that ends at `step`). Fields a line does not have are NaN.
struct StepRecord {
  int64_t step = 0, epoch = 0;
  double time_s = kNaN, loss = kNaN, lr = kNaN, samples_per_s = kNaN;
  double grad_norm = kNaN, loss_scale = kNaN, peak_mem_max = kNaN;
  std::array<double, kPhases> phase_ms{kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
  // Over ranks: each rank's own work per step (data wait + compute), its min / mean / max, the
  // slowest rank (-1: not recorded).
  double busy_min = kNaN, busy_mean = kNaN, busy_max = kNaN;
  int64_t slowest_rank = -1;
  std::vector<int64_t> skipped_at;  // steps skipped by loss scaling within the window
};

struct EvalRecord {
  int64_t step = 0, epoch = 0;
  double time_s = kNaN, test_loss = kNaN, test_accuracy = kNaN;
};

// Per-rank totals over every step record that lists ranks (mean = sum / records).
struct RankTotals {
  double data_wait_ms = 0, compute_ms = 0, exposed_comm_ms = 0;
  double peak_mem_bytes = kNaN;  // the last recorded (peaks only grow)
  int64_t records = 0, slowest_count = 0;
  // Per step record, for small worlds only (report.cc draws one line per rank): data wait +
  // compute per step.
  std::vector<double> busy_steps, busy_ms;
};

struct RunLog {
  std::string dir;   // as given
  std::string name;  // short label for legends (the directory's last component)
  bool exists = false;
  bool has_metrics = false;        // metrics.jsonl exists
  int64_t lines = 0, used = 0;     // lines read, lines used
  std::vector<std::string> notes;  // what was skipped or is missing, for the reader
  // The "start" record's facts as shown in the header table, in order (key, value).
  std::vector<std::pair<std::string, std::string>> info;
  int64_t world_size = 0;  // 0: unknown (no start record)
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
  std::vector<RankTotals> ranks;  // by rank; empty when no record lists ranks
  // The "summary" record: present when the run finished or was preempted.
  bool finished = false;
  std::string status;  // "finished", "preempted", "failed", "running or stopped" (no summary)
  double total_time_s = kNaN, mean_samples_per_s = kNaN;
  int64_t last_step = -1;   // the highest step any record names
  int64_t checkpoints = 0;  // "checkpoint" records (checkpoints written)
  std::string last_checkpoint;
  // The "error" record, or else a "dptrain: error:" line of a *.log / *.out / *.err file in dir.
  std::string error;
  int64_t error_step = -1, error_exit_code = -1;
  std::string error_source;           // "metrics.jsonl" or the log file's name
  double seconds_since_write = kNaN;  // age of metrics.jsonl (a running run's is small)
  // config.toml: "section.key" -> value text, in file order; and the whole text.
  std::vector<std::pair<std::string, std::string>> config;
  std::string config_text;
};

// Reads `dir`. Never throws for a missing directory or bad content (see `notes`); only I/O
// errors of a file that exists but cannot be read are noted too.
RunLog ReadRun(const std::string& dir);

// Parses the text of a metrics.jsonl into `run` (exposed for tests). A last line without its
// newline that does not parse was cut mid-write (or is being written): noted, skipped.
void ParseMetrics(const std::string& text, RunLog* run);

// "section.key" -> value for config.toml text of the form ToToml writes (exposed for tests).
std::vector<std::pair<std::string, std::string>> ParseConfigToml(const std::string& text);

}  // namespace dptrain::report
