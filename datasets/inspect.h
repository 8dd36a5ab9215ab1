// SPDX-License-Identifier: Apache-2.0
// `dptrain inspect FILE.h5`: a human-readable description of any HDF5 file (dataset files and
// checkpoints alike), with a summary for dataset files.
#pragma once

#include <string>

namespace dptrain {

// Lists every group and dataset in the file recursively, in name order, one per line:
//   /images  uint8 [60000, 1, 28, 28]  chunks [1337, 1, 28, 28]
// followed by their attributes (indented: `@classes = 10`, arrays abbreviated, strings quoted and
// shortened). For a dataset file (it has /images and /labels) a summary follows: N, sample shape,
// dtype, classes, label counts per class, and whether OpenHdf5Dataset accepts the file (or why
// not). Throws IoError naming the file when it is missing or not HDF5.
std::string DescribeHdf5File(const std::string& path);

// The HDF5 library this binary runs with, "1.10.8" (for `dptrain info`).
std::string Hdf5LibraryVersion();

}  // namespace dptrain
