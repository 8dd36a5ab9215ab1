// SPDX-License-Identifier: Apache-2.0
// What the HDF5 fuzz targets do with a file, shared by the raw-bytes targets and the
// structure-aware ones (hdf5_edits.h). A dptrain::Error is the only acceptable failure; these
// functions catch it and return.
#pragma once

#include <string>

namespace dptrain::fuzz {

// OpenHdf5Dataset (open + validation), then a Read of a few samples, once with the whole of
// /images in RAM and once through a small chunk LRU.
void ExerciseDatasetFile(const std::string& path);

// IsCheckpointFile, ReadCheckpoint, and when it verifies MatchCheckpoint against a small
// model's tensors (fc.weight [2, 3], fc.bias [2], bn.num_batches_tracked, SGD momentum) and
// DescribeCheckpoint (`dptrain inspect`).
void ExerciseCheckpointFile(const std::string& path);

}  // namespace dptrain::fuzz
