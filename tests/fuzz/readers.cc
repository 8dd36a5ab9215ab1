// SPDX-License-Identifier: Apache-2.0
// The HDF5 fuzz targets' readers (readers.h): a dataset file opened in both cache modes and a few
// samples read; a checkpoint file read, matched against a small model and described. A
// dptrain::Error is the only accepted failure.
#include "tests/fuzz/readers.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"
#include "datasets/dataset.h"
#include "runtime/checkpoint/checkpoint.h"

namespace dptrain::fuzz {
namespace {

void OpenAndRead(const std::string& path, CacheMode cache) {
  OpenOptions opts;
  opts.cache = cache;
  opts.chunk_cache_bytes = size_t(1) << 16;  // a small LRU: evictions happen
  std::unique_ptr<Dataset> ds;
  try {
    ds = OpenHdf5Dataset(path, opts);
  } catch (const Error&) {
    return;
  }
  const DatasetInfo& info = ds->info();
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
  } catch (const Error&) {
    return;
  }
}

}  // namespace

void ExerciseDatasetFile(const std::string& path) {
  OpenAndRead(path, CacheMode::kRam);
  OpenAndRead(path, CacheMode::kChunks);
}

void ExerciseCheckpointFile(const std::string& path) {
  try {
    (void)IsCheckpointFile(path);
    const Checkpoint ckpt = ReadCheckpoint(path);
    const std::vector<TensorSpec> params = {
        {"fc.weight", {2, 3}, CheckpointDType::kF32, false},
        {"fc.bias", {2}, CheckpointDType::kF32, false},
        {"bn.num_batches_tracked", {}, CheckpointDType::kI64, true}};
    const std::vector<TensorSpec> slots = {
        {"fc.weight/momentum_buffer", {2, 3}, CheckpointDType::kF32, false},
        {"fc.bias/momentum_buffer", {2}, CheckpointDType::kF32, false}};
    try {
      MatchCheckpoint(path, ckpt, params, &slots);
    } catch (const Error&) {
    }
    (void)DescribeCheckpoint(path);
  } catch (const Error&) {
  }
}

}  // namespace dptrain::fuzz
