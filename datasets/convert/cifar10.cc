// SPDX-License-Identifier: Apache-2.0
// CIFAR-10 binary version -> dataset HDF5: records of 1 label byte + 3 x 32 x 32 pixel bytes.
#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/util/input_file.h"
#include "datasets/convert/convert.h"
#include "datasets/dataset.h"

namespace dptrain {
namespace {

constexpr int64_t kPixels = int64_t{3} * 32 * 32;
constexpr int64_t kRecord = 1 + kPixels;
constexpr int kClasses = 10;

// Appends the records of one batch file.
void ReadBatch(const std::string& path, std::vector<uint8_t>* images,
               std::vector<int32_t>* labels) {
  std::vector<uint8_t> buf;
  if (const std::string why = ReadInputFile(path, "a CIFAR-10 batch file", &buf); !why.empty()) {
    DPT_THROW(IoError) << path << ": " << why
                       << (why == "no such file" ? " (CIFAR-10 binary version: data_batch_1.bin .. "
                                                   "data_batch_5.bin, test_batch.bin)"
                                                 : "");
  }
  const auto size = static_cast<int64_t>(buf.size());
  if (size == 0 || size % kRecord != 0) {
    DPT_THROW(DataError) << path << ": size " << size << " bytes is not a positive multiple of the "
                         << kRecord << "-byte CIFAR-10 record"
                         << (size > 0 && size % (kRecord + 1) == 0
                                 ? " (3074-byte records: this looks like CIFAR-100)"
                                 : " (file short or not CIFAR-10 binary)");
  }
  const int64_t n = size / kRecord;
  const size_t base = images->size();
  images->resize(base + static_cast<size_t>(n * kPixels));
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* rec = buf.data() + r * kRecord;
    if (rec[0] >= kClasses) {
      DPT_THROW(DataError) << path << ": record " << r << " has label " << int{rec[0]}
                           << ", expected 0..9";
    }
    labels->push_back(rec[0]);
    std::copy_n(rec + 1, kPixels, images->data() + base + static_cast<size_t>(r * kPixels));
  }
}

}  // namespace

void ConvertCifar10(const std::string& dir, const std::string& split, const std::string& out) {
  std::vector<std::string> files;
  if (split == "train") {
    for (int i = 1; i <= 5; ++i) files.push_back("data_batch_" + std::to_string(i) + ".bin");
  } else if (split == "test") {
    files.push_back("test_batch.bin");
  } else {
    DPT_THROW(ConfigError) << "--split " << split << ": expected train or test";
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    DPT_THROW(IoError) << dir << ": no such directory (CIFAR-10 binary version)";
  }
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
  for (const std::string& f : files) {
    ReadBatch((std::filesystem::path(dir) / f).string(), &images, &labels);
  }
  const auto n = static_cast<int64_t>(labels.size());
  WriteHdf5Dataset(out, images.data(), Shape({n, 3, 32, 32}), labels.data(), kClasses);
}

}  // namespace dptrain
