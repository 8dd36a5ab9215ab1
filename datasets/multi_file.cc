// SPDX-License-Identifier: Apache-2.0
// Datasets of several files (data.train / data.test as a list or a glob): the entries expanded
// in order, each file opened and validated as a single-file dataset, and the files presented as
// one dataset whose indices run over the files in that order.
#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "datasets/dataset.h"

namespace dptrain {
namespace {

bool IsPattern(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// Files in order; samples of file f are global indices [starts_[f], starts_[f + 1]).
class MultiFileDataset final : public Dataset {
 public:
  explicit MultiFileDataset(std::vector<std::unique_ptr<Dataset>> files)
      : files_(std::move(files)) {
    const DatasetInfo& first = files_.front()->info();
    info_ = first;
    info_.path = first.path + " (+" + std::to_string(files_.size() - 1) + " more files)";
    starts_.push_back(0);
    for (const auto& f : files_) {
      const DatasetInfo& i = f->info();
      const auto differs = [&](const std::string& what, const std::string& here,
                               const std::string& there) {
        DPT_THROW(DataError) << i.path << ": " << what << " " << here << " differ from "
                             << first.path << "'s " << there
                             << "; every file of a dataset must agree";
      };
      if (i.sample_shape != first.sample_shape) {
        differs("samples of shape", i.sample_shape.ToString(), first.sample_shape.ToString());
      }
      if (i.image_dtype != first.image_dtype) {
        differs("/images of type", DTypeName(i.image_dtype), DTypeName(first.image_dtype));
      }
      if (i.classes != first.classes) {
        differs("classes =", std::to_string(i.classes), std::to_string(first.classes));
      }
      if (i.class_names != first.class_names) {
        differs("class names", Join(i.class_names), Join(first.class_names));
      }
      starts_.push_back(starts_.back() + i.size);
    }
    info_.size = starts_.back();
    sample_numel_ = info_.sample_shape.numel();
  }

  const DatasetInfo& info() const override { return info_; }

  void Read(const int64_t* indices, int64_t count, float* images, int32_t* labels) override {
    ReadFrom(indices, count, images, labels,
             [](Dataset& f, const int64_t* idx, int64_t n, float* img, int32_t* lab) {
               f.Read(idx, n, img, lab);
               return true;
             });
  }

  bool ReadU8(const int64_t* indices, int64_t count, uint8_t* images, int32_t* labels) override {
    if (info_.image_dtype != DType::kU8) return false;
    return ReadFrom(indices, count, images, labels,
                    [](Dataset& f, const int64_t* idx, int64_t n, uint8_t* img, int32_t* lab) {
                      return f.ReadU8(idx, n, img, lab);
                    });
  }

 private:
  // Each file reads its own samples in one call (`read`); the results go back to their
  // positions. False when a file's read does.
  template <class T, class ReadFn>
  bool ReadFrom(const int64_t* indices, int64_t count, T* images, int32_t* labels,
                const ReadFn& read) {
    std::vector<std::vector<int64_t>> local(files_.size()), where(files_.size());
    for (int64_t k = 0; k < count; ++k) {
      const int64_t idx = indices[k];
      DPT_CHECK(idx >= 0 && idx < info_.size)
          << "sample index " << idx << " outside [0, " << info_.size << ")";
      const size_t f = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), idx) -
                                           starts_.begin() - 1);
      local[f].push_back(idx - starts_[f]);
      where[f].push_back(k);
    }
    std::vector<T> img;
    std::vector<int32_t> lab;
    for (size_t f = 0; f < files_.size(); ++f) {
      const int64_t n = static_cast<int64_t>(local[f].size());
      if (n == 0) continue;
      if (n == count) {  // every sample from one file: straight into the caller's buffers
        return read(*files_[f], local[f].data(), n, images, labels);
      }
      img.resize(static_cast<size_t>(n * sample_numel_));
      lab.resize(static_cast<size_t>(n));
      if (!read(*files_[f], local[f].data(), n, img.data(), lab.data())) return false;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t k = where[f][static_cast<size_t>(j)];
        std::copy_n(img.data() + j * sample_numel_, sample_numel_, images + k * sample_numel_);
        labels[k] = lab[static_cast<size_t>(j)];
      }
    }
    return true;
  }

  static std::string Join(const std::vector<std::string>& names) {
    if (names.empty()) return "(none)";
    std::string out = "[";
    for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
    return out + (names.size() > 8 ? ", ...]" : "]");
  }

  std::vector<std::unique_ptr<Dataset>> files_;
  std::vector<int64_t> starts_;
  DatasetInfo info_;
  int64_t sample_numel_ = 0;
};

}  // namespace

std::vector<std::string> ExpandDatasetPaths(const std::vector<std::string>& entries) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& e : entries) {
    std::vector<std::string> files;
    if (!IsPattern(e)) {
      files.push_back(e);  // opened as written: a missing file is the open's error, named
    } else {
      glob_t g{};
      const int rc = glob(e.c_str(), 0, nullptr, &g);
      for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
        DPT_THROW(DataError) << "no file matches the pattern '" << e << "'";
      }
      DPT_CHECK_AS(DataError, rc == 0) << "cannot list the files matching '" << e << "'";
      std::sort(files.begin(), files.end());  // glob sorts by locale; this is byte order
    }
    for (std::string& f : files) {
      std::error_code ec;
      const std::filesystem::path canon = std::filesystem::weakly_canonical(f, ec);
      const std::string key = ec ? f : canon.string();
      if (!seen.insert(key).second) {
        DPT_THROW(DataError) << f << " is listed more than once (its samples would be counted "
                             << "twice)";
      }
      out.push_back(std::move(f));
    }
  }
  DPT_CHECK_AS(DataError, !out.empty()) << "no dataset file given";
  return out;
}

std::unique_ptr<Dataset> OpenHdf5Datasets(const std::vector<std::string>& entries,
                                          const OpenOptions& opts) {
  const std::vector<std::string> paths = ExpandDatasetPaths(entries);
  if (paths.size() == 1) return OpenHdf5Dataset(paths.front(), opts);
  // The RAM and chunk-cache budgets are for the dataset, shared by its files.
  OpenOptions each = opts;
  each.ram_limit_bytes = opts.ram_limit_bytes / paths.size();
  each.chunk_cache_bytes = std::max<size_t>(opts.chunk_cache_bytes / paths.size(), size_t{4} << 20);
  std::vector<std::unique_ptr<Dataset>> files;
  files.reserve(paths.size());
  for (const std::string& p : paths) files.push_back(OpenHdf5Dataset(p, each));
  return std::make_unique<MultiFileDataset>(std::move(files));
}

}  // namespace dptrain
