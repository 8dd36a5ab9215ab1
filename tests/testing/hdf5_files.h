// SPDX-License-Identifier: Apache-2.0
// Test helpers for dataset files (TempDir is in temp_dir.h): deterministic small
// datasets and raw byte files. No HDF5 types: files are written through datasets/ APIs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "tests/testing/temp_dir.h"

namespace dptrain::testing {

// A small deterministic uint8 dataset: pixel j of sample i = (i * 31 + j * 7) % 256,
// label i = i % classes. images: (n, c, h, w).
struct SmallU8Data {
  Shape shape;
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
};
SmallU8Data MakeSmallU8(int64_t n, int64_t c, int64_t h, int64_t w, int64_t classes);

// Writes MakeSmallU8(...) with WriteHdf5Dataset (classes attribute = classes) and returns it.
SmallU8Data WriteSmallU8Dataset(const std::string& path, int64_t n, int64_t c, int64_t h, int64_t w,
                                int64_t classes);

// Writes `bytes` to `path` (binary), replacing it.
void WriteBytes(const std::string& path, const std::string& bytes);
std::string ReadBytes(const std::string& path);

}  // namespace dptrain::testing
