// SPDX-License-Identifier: Apache-2.0
// The checkpoint directory: listing checkpoints newest first, finding the latest one that verifies
// (ReadCheckpoint, in checkpoint_read.cc) and removing temporaries left by an interrupted write.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/hdf5/checkpoint_file.h"

namespace dptrain {
namespace {

namespace fs = std::filesystem;

int64_t StepOf(const std::string& file_name) {
  static const std::regex kName(R"(ckpt-(\d{8,})\.h5)");
  std::smatch m;
  if (!std::regex_match(file_name, m, kName)) return -1;
  return std::stoll(m[1].str());
}

}  // namespace

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    const int64_t step = StepOf(file);
    if (step >= 0 && it->is_regular_file(ec)) found.emplace_back(step, it->path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> out;
  out.reserve(found.size());
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::optional<FoundCheckpoint> FindLatestCheckpoint(const std::string& dir,
                                                    std::vector<std::string>* skipped) {
  for (const std::string& path : ListCheckpoints(dir)) {
    try {
      Checkpoint c = ReadCheckpoint(path);
      if (!c.has_state) {
        DPT_THROW(CheckpointError) << "checkpoint " << path << ": no /state group";
      }
      return FoundCheckpoint{path, std::move(c)};
    } catch (const CheckpointError& e) {
      skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

std::vector<std::string> RemoveStaleTemporaries(const std::string& dir) {
  static const std::regex kTmp(R"(\.ckpt-\d{8,}\.h5\.tmp)");
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    std::error_code rm;
    if (std::regex_match(file, kTmp) && fs::remove(it->path(), rm)) {
      removed.push_back(it->path().string());
    }
  }
  return removed;
}

}  // namespace dptrain
