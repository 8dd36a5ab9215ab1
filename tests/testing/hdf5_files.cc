// SPDX-License-Identifier: Apache-2.0
// Temporary directories and small dataset files for the dataset, converter and loader tests.
#include "tests/testing/hdf5_files.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "datasets/dataset.h"

namespace dptrain::testing {

SmallU8Data MakeSmallU8(int64_t n, int64_t c, int64_t h, int64_t w, int64_t classes) {
  SmallU8Data d;
  d.shape = Shape({n, c, h, w});
  const int64_t numel = c * h * w;
  d.images.resize(static_cast<size_t>(n * numel));
  d.labels.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < numel; ++j) {
      d.images[static_cast<size_t>(i * numel + j)] = static_cast<uint8_t>((i * 31 + j * 7) % 256);
    }
    d.labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % classes);
  }
  return d;
}

SmallU8Data WriteSmallU8Dataset(const std::string& path, int64_t n, int64_t c, int64_t h, int64_t w,
                                int64_t classes) {
  SmallU8Data d = MakeSmallU8(n, c, h, w, classes);
  WriteHdf5Dataset(path, d.images.data(), d.shape, d.labels.data(), classes);
  return d;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace dptrain::testing
