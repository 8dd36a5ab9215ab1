// SPDX-License-Identifier: Apache-2.0
// Checkpoints as the runtime uses them: matching a checkpoint against a model's tensor specs and
// the background CheckpointWriter. The file format itself (write, read + verify, find-latest,
// inspect) is core/hdf5/checkpoint_file.h.
#include "runtime/checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <map>
#include <utility>

#include "core/error.h"
#include "core/util/strings.h"

namespace dptrain {

namespace {

// "" when `have` matches `expected`, else every difference in words.
std::string Mismatch(const std::string& group, const std::vector<CheckpointTensor>& have,
                     const std::vector<TensorSpec>& expected) {
  std::map<std::string, const CheckpointTensor*> by_name;
  for (const CheckpointTensor& t : have) by_name[t.name] = &t;
  std::vector<std::string> missing, misshaped, unexpected;
  for (const TensorSpec& s : expected) {
    auto it = by_name.find(s.name);
    if (it == by_name.end()) {
      if (!s.optional) missing.push_back(s.name + " " + CheckpointShapeString(s.shape));
      continue;
    }
    const CheckpointTensor& t = *it->second;
    if (t.shape != s.shape || t.dtype != s.dtype) {
      misshaped.push_back(fmt::format("{} is {} {} in the file, {} {} in the model", s.name,
                                      CheckpointDTypeName(t.dtype), CheckpointShapeString(t.shape),
                                      CheckpointDTypeName(s.dtype),
                                      CheckpointShapeString(s.shape)));
    }
    by_name.erase(it);
  }
  for (const auto& [name, t] : by_name)
    unexpected.push_back(name + " " + CheckpointShapeString(t->shape));
  std::vector<std::string> parts;
  if (!missing.empty()) {
    parts.push_back(fmt::format("{} missing: {}", missing.size(), Join(missing, ", ")));
  }
  if (!unexpected.empty()) {
    parts.push_back(fmt::format("{} unexpected: {}", unexpected.size(), Join(unexpected, ", ")));
  }
  if (!misshaped.empty()) {
    parts.push_back(fmt::format("{} mis-shaped: {}", misshaped.size(), Join(misshaped, "; ")));
  }
  return parts.empty() ? "" : group + ": " + Join(parts, "; ");
}

}  // namespace

void MatchCheckpoint(const std::string& path, const Checkpoint& ckpt,
                     const std::vector<TensorSpec>& params,
                     const std::vector<TensorSpec>* optimizer) {
  std::vector<std::string> problems;
  if (std::string m = Mismatch("/params", ckpt.params, params); !m.empty()) problems.push_back(m);
  if (optimizer != nullptr) {
    if (std::string m = Mismatch("/optimizer", ckpt.optimizer, *optimizer); !m.empty()) {
      problems.push_back(m);
    }
  }
  if (problems.empty()) return;
  DPT_THROW(CheckpointError) << "checkpoint " << path
                             << " does not match the model: " << Join(problems, "; ")
                             << "; hint: is it a checkpoint of another model (model.name, "
                                "model.layers, model.classes) or optimizer (train.optimizer)?";
}

CheckpointWriter::CheckpointWriter(std::string dir, int64_t keep, CheckpointPauseHook pause)
    : dir_(std::move(dir)), keep_(keep), pause_(pause) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::Submit(Checkpoint ckpt) {
  if (thread_.joinable()) thread_.join();
  if (failed_.load()) return;  // the pending error is reported by Wait()
  thread_ = std::thread(&CheckpointWriter::Run, this, std::move(ckpt));
}

void CheckpointWriter::Run(const Checkpoint& ckpt) {
  try {
    CheckpointWriteStats stats = WriteCheckpoint(dir_, ckpt, keep_, pause_);
    std::lock_guard<std::mutex> lock(mu_);
    completed_.push_back(std::move(stats));
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    failed_.store(true);
  }
}

void CheckpointWriter::Wait() {
  if (thread_.joinable()) thread_.join();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = std::exchange(error_, nullptr);
    failed_.store(false);
  }
  if (e) std::rethrow_exception(e);
}

std::vector<CheckpointWriteStats> CheckpointWriter::TakeCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(completed_, {});
}

}  // namespace dptrain
