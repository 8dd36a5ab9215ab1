// SPDX-License-Identifier: Apache-2.0
// Fuzz target: OpenHdf5Dataset (open + validation) on a file holding the fuzz input, then a Read
// of a few samples, once with the whole of /images in RAM and once through the chunk LRU.
// A dptrain::Error (DataError for a bad file) is the only acceptable failure.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/dataset.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void OpenAndRead(const std::string& path, const char* cache) {
  dptrain::OpenOptions opts;
  opts.cache = cache;
  opts.chunk_cache_bytes = size_t(1) << 16;  // a small LRU: evictions happen
  std::unique_ptr<dptrain::Dataset> ds;
  try {
    ds = dptrain::OpenHdf5Dataset(path, opts);
  } catch (const dptrain::Error&) {
    return;
  }
  const dptrain::DatasetInfo& info = ds->info();
  const int64_t n = info.size;
  std::vector<int64_t> idx = {0, n - 1, n / 2, 0};
  const int64_t numel = info.sample_shape.numel();
  // The harness's own buffers stay small; a huge sample that validation let through would
  // already have been allocated by the dataset in RAM mode.
  if (numel <= 0 || numel > (int64_t{1} << 22)) return;
  std::vector<float> images(idx.size() * static_cast<size_t>(numel));
  std::vector<int32_t> labels(idx.size());
  try {
    ds->Read(idx.data(), static_cast<int64_t>(idx.size()), images.data(), labels.data());
  } catch (const dptrain::Error&) {
    return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = dptrain::fuzz::TempPath("dataset.h5");
  dptrain::fuzz::WriteFile(path, std::string_view(reinterpret_cast<const char*>(data), size));
  OpenAndRead(path, "ram");
  OpenAndRead(path, "chunks");
  return 0;
}
