// SPDX-License-Identifier: Apache-2.0
// Reading a run directory for `dptrain report` (runtime/report/run_log.h). Tolerant by design:
// the file may be growing (a running job), cut (a killed one) or written by another version.
#include "runtime/report/run_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace dptrain::report {

const std::array<const char*, kPhases> kPhaseKeys = {"data_wait",    "forward",   "backward",
                                                     "exposed_comm", "optimizer", "other"};
const std::array<const char*, kPhases> kPhaseLabels = {
    "data wait", "forward", "backward", "exposed communication", "optimizer", "other"};

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double Num(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
}

int64_t Int(const json& j, const char* key, int64_t fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? static_cast<int64_t>(it->get<double>()) : fallback;
}

std::string Str(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

std::vector<double> Numbers(const json& j) {
  std::vector<double> v;
  if (!j.is_array()) return v;
  for (const auto& e : j) v.push_back(e.is_number() ? e.get<double>() : kNaN);
  return v;
}

// 1234567 -> "1,234,567".
std::string Thousands(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Lines skipped for one reason: how many, and the first line number.
struct Skips {
  std::map<std::string, std::pair<int64_t, int64_t>> by_reason;
  void Add(const std::string& why, int64_t line) {
    auto [it, fresh] = by_reason.try_emplace(why, 0, line);
    ++it->second.first;
  }
};

void ReadStart(const json& j, RunLog* run) {
  run->world_size = Int(j, "world_size", 0);
  std::vector<std::pair<std::string, std::string>> info;
  auto add = [&](const std::string& k, const std::string& v) {
    if (!v.empty()) info.emplace_back(k, v);
  };
  add("model", Str(j, "model"));
  if (j.contains("params")) add("parameters", Thousands(Int(j, "params", 0)));
  if (run->world_size > 0) {
    const int64_t hosts = Int(j, "hosts", 1);
    add("world size", fmt::format("{} rank{} on {} host{}", run->world_size,
                                  run->world_size == 1 ? "" : "s", hosts, hosts == 1 ? "" : "s"));
  }
  if (j.contains("devices") && j["devices"].is_array()) {
    // "host device" per rank -> "2 x cpu", counted by device.
    std::map<std::string, int64_t> count;
    for (const auto& d : j["devices"]) {
      if (!d.is_string()) continue;
      const auto s = d.get<std::string>();
      const size_t sp = s.find(' ');
      ++count[sp == std::string::npos ? s : s.substr(sp + 1)];
    }
    std::string devs;
    for (const auto& [d, n] : count)
      devs += fmt::format("{}{} × {}", devs.empty() ? "" : ", ", n, d);
    add("devices", devs);
  }
  if (j.contains("threads")) add("threads per rank", std::to_string(Int(j, "threads", 0)));
  if (j.contains("global_batch")) {
    const int64_t g = Int(j, "global_batch", 0), micro = Int(j, "micro_batch", 0);
    const int64_t acc = Int(j, "accumulate", 1);
    std::string b = std::to_string(g);
    if (run->world_size > 0) {
      b += fmt::format(" ({} per rank{})", g / run->world_size,
                       acc > 1 ? fmt::format(" = {} × {} micro-steps", micro, acc) : "");
    }
    add("global batch", b);
  }
  add("precision", Str(j, "precision"));
  add("optimizer", Str(j, "optimizer"));
  if (j.contains("train_samples")) add("train samples", Thousands(Int(j, "train_samples", 0)));
  if (j.contains("test_samples")) add("test samples", Thousands(Int(j, "test_samples", 0)));
  if (j.contains("total_steps")) {
    add("planned steps", fmt::format("{} ({} per epoch)", Thousands(Int(j, "total_steps", 0)),
                                     Thousands(Int(j, "steps_per_epoch", 0))));
  }
  add("dptrain version", Str(j, "version"));
  run->info = std::move(info);
}

void ReadStep(const json& j, RunLog* run, int64_t* old_format) {
  StepRecord r;
  r.step = Int(j, "step", 0);
  r.epoch = Int(j, "epoch", 0);
  r.time_s = Num(j, "time_s");
  r.loss = Num(j, "loss");
  r.lr = Num(j, "lr");
  r.samples_per_s = Num(j, "samples_per_s");
  r.grad_norm = Num(j, "grad_norm");
  r.loss_scale = Num(j, "loss_scale");
  if (j.contains("peak_mem_bytes") && j["peak_mem_bytes"].is_object()) {
    r.peak_mem_max = Num(j["peak_mem_bytes"], "max");
  }
  if (j.contains("phase_ms") && j["phase_ms"].is_object()) {
    for (int p = 0; p < kPhases; ++p) r.phase_ms[p] = Num(j["phase_ms"], kPhaseKeys[p]);
  } else {
    ++*old_format;
  }
  r.slowest_rank = Int(j, "slowest_rank", -1);
  if (j.contains("skipped_at") && j["skipped_at"].is_array()) {
    for (const auto& s : j["skipped_at"]) {
      if (s.is_number()) r.skipped_at.push_back(static_cast<int64_t>(s.get<double>()));
    }
  }
  if (j.contains("rank_ms") && j["rank_ms"].is_object()) {
    const json& rm = j["rank_ms"];
    const auto data = Numbers(rm.value("data_wait", json()));
    const auto compute = Numbers(rm.value("compute", json()));
    const auto comm = Numbers(rm.value("exposed_comm", json()));
    const auto peak = Numbers(j.value("rank_peak_mem_bytes", json()));
    const size_t n = std::min(data.size(), compute.size());
    if (run->ranks.size() < n) run->ranks.resize(n);
    double lo = kNaN, hi = kNaN, sum = 0;
    for (size_t i = 0; i < n; ++i) {
      RankTotals& t = run->ranks[i];
      const double busy = data[i] + compute[i];
      t.data_wait_ms += data[i];
      t.compute_ms += compute[i];
      if (i < comm.size()) t.exposed_comm_ms += comm[i];
      if (i < peak.size()) t.peak_mem_bytes = peak[i];
      ++t.records;
      if (n <= 8) {
        t.busy_steps.push_back(static_cast<double>(r.step));
        t.busy_ms.push_back(busy);
      }
      lo = i == 0 ? busy : std::min(lo, busy);
      hi = i == 0 ? busy : std::max(hi, busy);
      sum += busy;
    }
    if (n > 0) {
      r.busy_min = lo;
      r.busy_max = hi;
      r.busy_mean = sum / static_cast<double>(n);
    }
  }
  if (r.slowest_rank >= 0 && static_cast<size_t>(r.slowest_rank) < run->ranks.size()) {
    ++run->ranks[static_cast<size_t>(r.slowest_rank)].slowest_count;
  }
  run->steps.push_back(std::move(r));
}

// The last "dptrain: error:" line of a log file in `dir` (a job's captured output).
void FindLoggedError(const fs::path& dir, RunLog* run) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".log" && ext != ".out" && ext != ".err") continue;
    if (!e.is_regular_file(ec)) continue;
    std::ifstream f(e.path(), std::ios::binary);
    // The end of the file is where a job's last error is.
    constexpr std::streamoff kTail = 1 << 20;
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    f.seekg(std::max<std::streamoff>(0, size - kTail));
    std::string line, found;
    while (std::getline(f, line)) {
      const size_t at = line.find("dptrain: error: ");
      if (at != std::string::npos) found = line.substr(at + 16);
    }
    if (!found.empty()) {
      run->error = found;
      run->error_source = e.path().filename().string();
    }
  }
}

}  // namespace

void ParseMetrics(const std::string& text, RunLog* run) {
  std::istringstream in(text);
  std::string line;
  int64_t n = 0, old_format = 0, starts = 0;
  Skips skips;
  std::set<int64_t> worlds;
  const bool ends_with_newline = !text.empty() && text.back() == '\n';
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      if (in.peek() == std::char_traits<char>::eof() && !ends_with_newline) {
        skips.Add("the last line is incomplete (cut mid-write, or still being written)", n);
      } else {
        skips.Add("not a JSON object", n);
      }
      continue;
    }
    const std::string kind = j.contains("kind") && j["kind"].is_string() ? Str(j, "kind") : "";
    if (kind.empty()) {
      skips.Add("no \"kind\"", n);
      continue;
    }
    const bool needs_step = kind == "step" || kind == "eval";
    if (needs_step && !(j.contains("step") && j["step"].is_number())) {
      skips.Add(fmt::format("a {} record without a \"step\" number", kind), n);
      continue;
    }
    run->last_step = std::max(run->last_step, Int(j, "step", -1));
    if (kind == "step") {
      ReadStep(j, run, &old_format);
    } else if (kind == "eval") {
      EvalRecord e;
      e.step = Int(j, "step", 0);
      e.epoch = Int(j, "epoch", 0);
      e.time_s = Num(j, "time_s");
      e.test_loss = Num(j, "test_loss");
      e.test_accuracy = Num(j, "test_accuracy");
      run->evals.push_back(e);
    } else if (kind == "start") {
      ReadStart(j, run);
      ++starts;
      if (run->world_size > 0) worlds.insert(run->world_size);
    } else if (kind == "summary") {
      run->finished = true;
      if (j.contains("status") && j["status"].is_string()) {
        run->status = Str(j, "status");
      } else {  // before the summary had a status
        run->status = Int(j, "stop_signal", 0) != 0 ? "preempted" : "finished";
      }
      run->total_time_s = Num(j, "time_s");
      run->mean_samples_per_s = Num(j, "samples_per_s");
    } else if (kind == "error") {
      run->error = Str(j, "message");
      run->error_step = Int(j, "step", -1);
      run->error_exit_code = Int(j, "exit_code", -1);
      run->error_source = "metrics.jsonl";
    } else if (kind == "checkpoint") {
      ++run->checkpoints;
      run->last_checkpoint = Str(j, "path");
    } else if (kind != "epoch") {
      skips.Add(fmt::format("of unknown kind \"{}\" (from a newer dptrain?)", kind), n);
      continue;
    }
    ++run->used;
  }
  run->lines += n;
  for (const auto& [why, v] : skips.by_reason) {
    run->notes.push_back(
        v.first == 1 ? fmt::format("skipped line {}: {}", v.second, why)
                     : fmt::format("skipped {} lines {} (first: line {})", v.first, why, v.second));
  }
  if (old_format > 0) {
    run->notes.push_back(fmt::format(
        "{} of {} step records have no time split or per-rank timing (written by an older "
        "dptrain): those charts show the rest",
        old_format, run->steps.size()));
  }
  if (starts == 0 && run->used > 0) {
    run->notes.push_back(
        "no \"start\" record (an older dptrain): model, ranks and devices are unknown");
  }
  if (starts > 1) {
    std::string ws;
    for (int64_t w : worlds) ws += (ws.empty() ? "" : ", ") + std::to_string(w);
    run->notes.push_back(fmt::format("the run was resumed {} time{} (world sizes: {})", starts - 1,
                                     starts == 2 ? "" : "s", ws));
  }
}

std::vector<std::pair<std::string, std::string>> ParseConfigToml(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string line, section, pending_key, pending;
  int depth = 0;
  auto trim = [](const std::string& s) {
    const size_t a = s.find_first_not_of(" \t\r");
    const size_t b = s.find_last_not_of(" \t\r");
    return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
  };
  while (std::getline(in, line)) {
    if (depth > 0) {  // a multi-line array: join it
      pending += " " + trim(line);
      depth += static_cast<int>(std::count(line.begin(), line.end(), '[')) -
               static_cast<int>(std::count(line.begin(), line.end(), ']'));
      if (depth <= 0) out.emplace_back(pending_key, pending);
      continue;
    }
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = (section.empty() ? "" : section + ".") + trim(line.substr(0, eq));
    const std::string value = trim(line.substr(eq + 1));
    depth = static_cast<int>(std::count(value.begin(), value.end(), '[')) -
            static_cast<int>(std::count(value.begin(), value.end(), ']'));
    if (depth > 0) {
      pending_key = key;
      pending = value;
    } else {
      out.emplace_back(key, value);
    }
  }
  return out;
}

RunLog ReadRun(const std::string& dir) {
  RunLog run;
  run.dir = dir;
  fs::path p(dir);
  run.name = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
  if (run.name.empty()) run.name = dir;
  std::error_code ec;
  if (!fs::is_directory(p, ec)) {
    run.notes.push_back(fs::exists(p, ec) ? "not a directory" : "no such directory");
    run.status = "missing";
    return run;
  }
  run.exists = true;
  const fs::path metrics = p / "metrics.jsonl";
  if (fs::exists(metrics, ec)) {
    run.has_metrics = true;
    std::ifstream f(metrics, std::ios::binary);
    std::stringstream buf;
    buf << f.rdbuf();
    if (!f) {
      run.notes.push_back("metrics.jsonl cannot be read");
    } else {
      ParseMetrics(buf.str(), &run);
    }
    const auto age = fs::file_time_type::clock::now() - fs::last_write_time(metrics, ec);
    if (!ec) run.seconds_since_write = std::chrono::duration<double>(age).count();
    if (run.lines == 0) run.notes.push_back("metrics.jsonl is empty");
  } else {
    run.notes.push_back("no metrics.jsonl");
  }
  const fs::path config = p / "config.toml";
  if (fs::exists(config, ec)) {
    std::ifstream f(config);
    std::stringstream buf;
    buf << f.rdbuf();
    run.config_text = buf.str();
    run.config = ParseConfigToml(run.config_text);
  } else if (run.has_metrics) {
    run.notes.push_back("no config.toml (the configuration is not shown)");
  }
  if (run.error.empty()) FindLoggedError(p, &run);
  if (!run.error.empty()) {
    run.status = "failed";
  } else if (!run.finished && run.used > 0) {
    run.status = "running or stopped";
  }
  return run;
}

}  // namespace dptrain::report
