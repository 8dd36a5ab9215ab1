// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the HDF5 dataset tests (hdf5_dataset_test.cc, hdf5_dataset_errors_test.cc):
// open options by cache-mode name, the expected-DataError check, and raw dataset files.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "datasets/dataset.h"
#include "datasets/hdf5_writer.h"

namespace dptrain {

inline OpenOptions Mode(const std::string& cache, int64_t classes = -1) {
  OpenOptions o;
  o.cache = cache == "ram" ? CacheMode::kRam
                           : (cache == "chunks" ? CacheMode::kChunks : CacheMode::kAuto);
  o.classes = classes;
  return o;
}

// Expects OpenHdf5Dataset to throw DataError whose message has every string in `parts`.
inline void ExpectOpenError(const std::string& path, const std::vector<std::string>& parts,
                            const OpenOptions& opts = OpenOptions()) {
  try {
    OpenHdf5Dataset(path, opts);
    ADD_FAILURE() << "expected DataError opening " << path;
  } catch (const DataError& e) {
    EXPECT_EQ(e.exit_code(), kExitData);
    for (const std::string& p : parts) EXPECT_THAT(e.what(), ::testing::HasSubstr(p));
  }
}

// A raw file with /images and /labels of any type and shape.
inline void WriteRaw(const std::string& path, H5Elem img_elem, const std::vector<int64_t>& img_dims,
                     const void* img, H5Elem lab_elem, const std::vector<int64_t>& lab_dims,
                     const void* lab, int64_t chunk_rows = 0) {
  Hdf5Writer w(path);
  w.WriteArray("/images", img_elem, img_dims, img, chunk_rows);
  w.WriteArray("/labels", lab_elem, lab_dims, lab);
  w.Close();
}

}  // namespace dptrain
