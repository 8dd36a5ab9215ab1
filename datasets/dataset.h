// SPDX-License-Identifier: Apache-2.0
// The Dataset seam: random access to (image, label) samples as float32/int32 on the host. The
// HDF5 implementation validates the whole file at open (schema, label range, finite pixels) so
// that a bad file fails before training with a message naming the file and the HDF5 dataset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dptrain {

// What a dataset holds. Plain data, copied freely.
struct DatasetInfo {
  std::string path;                // the file ("<memory>" for MakeMemoryDataset)
  int64_t size = 0;                // N, number of samples
  Shape sample_shape;              // (C, H, W)
  DType image_dtype = DType::kU8;  // storage type of /images: kU8 or kF32
  // Number of classes: the file's `classes` attribute when present, else OpenOptions::classes
  // when > 0, else -1 (unknown).
  int64_t classes = -1;
  // Per-channel statistics from the file's `mean` / `std` attributes (1 or C values); empty when
  // the file has none. Informational: the loader normalises with LoaderOptions.
  std::vector<float> mean, std;
  // Class names in label order, from the file's `class_names` attribute (one string, the names
  // joined by "\n", as `dptrain convert --from imagefolder` writes it); empty when it has none.
  // When present there are exactly `classes` of them.
  std::vector<std::string> class_names;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual const DatasetInfo& info() const = 0;

  // Reads the samples `indices[0..count)` (any order, repeats allowed, each in [0, size)) into
  //   images: count * C * H * W float32, sample i at images + i * C*H*W, CHW order. uint8 pixels
  //           become x / 255 (in [0, 1]); float32 pixels are copied. NOT normalised.
  //   labels: count int32.
  // Both buffers are owned by the caller. Thread-safe: several loader threads may call Read at
  // once. Blocking (file I/O). An index out of range is a bug (InternalError).
  virtual void Read(const int64_t* indices, int64_t count, float* images, int32_t* labels) = 0;
  // As Read, but the stored uint8 pixels themselves (not divided by 255), for the loader's crops
  // (a quarter of the bytes of Read's floats). Returns false, reading nothing, when the dataset
  // does not store uint8.
  virtual bool ReadU8(const int64_t* /*indices*/, int64_t /*count*/, uint8_t* /*images*/,
                      int32_t* /*labels*/) {
    return false;
  }
};

// data.cache: how the HDF5 dataset holds /images (OpenOptions::cache).
enum class CacheMode : uint8_t { kAuto, kRam, kChunks };

struct OpenOptions {
  // The model's number of classes; when > 0 every label must be in [0, classes). When <= 0 the
  // file's `classes` attribute (if any) is used for that check instead.
  int64_t classes = -1;
  // kAuto: hold /images in RAM when it is at most ram_limit_bytes (stored size), else kChunks.
  // kRam: always hold the whole of /images in RAM (fastest random access).
  // kChunks: read whole HDF5 chunks on demand and keep the most recently used ones, up to
  //           chunk_cache_bytes, decoded in RAM (an LRU shared by all reader threads).
  CacheMode cache = CacheMode::kAuto;
  size_t ram_limit_bytes = size_t(4) << 30;
  size_t chunk_cache_bytes = size_t(64) << 20;
};

// Opens and validates an HDF5 dataset file (DESIGN.md section 5):
//   /images  uint8 or float32, [N, C, H, W] (or [N, H, W], read as C = 1)
//   /labels  any integer type, [N], read as int32
//   optional attributes (on the root group; `classes` is also looked for on /labels):
//     classes (integer scalar), mean, std (1 or C floats).
// Every label is checked at open (>= 0, and < classes when a class count is known); float images
// are scanned for NaN/Inf at open. Throws DataError (exit 3) whose message names the file and
// the HDF5 dataset: missing file, not HDF5 / truncated, missing /images or /labels, wrong rank or
// dtype, N mismatch, N == 0, bad label (first bad index and value), non-finite pixel.
std::unique_ptr<Dataset> OpenHdf5Dataset(const std::string& path, const OpenOptions& opts);

// data.train / data.test: entries that are files or glob patterns (*, ?, [...]), expanded in
// order, each pattern's matches sorted by name. Throws DataError for a pattern that matches
// nothing and for a file listed twice (directly or through patterns).
std::vector<std::string> ExpandDatasetPaths(const std::vector<std::string>& entries);
// Opens the files of ExpandDatasetPaths(entries) as one dataset: global indices run over the
// files in that order (file 0's samples first), so sampling, sharding over ranks, resume and
// evaluation are those of one file holding them all. Every file is validated as by
// OpenHdf5Dataset and must agree with the first on sample shape, /images type, classes and
// class names (DataError naming the file that differs). The RAM and chunk-cache budgets of
// `opts` are shared by the files. One file: OpenHdf5Dataset's dataset itself.
std::unique_ptr<Dataset> OpenHdf5Datasets(const std::vector<std::string>& entries,
                                          const OpenOptions& opts);

// An in-memory float32 dataset (synthetic data, tests). images: N * numel(sample_shape) floats,
// labels: N. Throws DataError when the sizes disagree or N == 0. Read is thread-safe.
std::unique_ptr<Dataset> MakeMemoryDataset(std::vector<float> images, std::vector<int32_t> labels,
                                           Shape sample_shape);

// Writes a dataset file in the layout above, for the converters and tests:
//   /images  uint8 (or float32) images_shape = [N, C, H, W], chunked along N with
//            max(1, ~1 MiB / sample bytes) samples per chunk (at most N), uncompressed
//   /labels  int32 [N]
//   attribute `classes` (int64) on the root group when classes > 0 (labels are checked against
//   it), plus `mean` / `std` (float32 arrays) when given.
// Writes `path + ".tmp"`, flushes, fsyncs and renames, so a crash never leaves a torn file.
// Throws DataError for inconsistent arguments (N == 0, bad label), IoError when writing fails.
void WriteHdf5Dataset(const std::string& path, const uint8_t* images, const Shape& images_shape,
                      const int32_t* labels, int64_t classes, const std::vector<float>& mean = {},
                      const std::vector<float>& std = {});
void WriteHdf5Dataset(const std::string& path, const float* images, const Shape& images_shape,
                      const int32_t* labels, int64_t classes, const std::vector<float>& mean = {},
                      const std::vector<float>& std = {});

}  // namespace dptrain
