// SPDX-License-Identifier: Apache-2.0
// `dptrain convert --from idx|cifar10|npy ... --out FILE`: a dataset to dptrain's HDF5 format.
#pragma once

#include <string>

namespace dptrain {

struct ConvertArgs {
  std::string from;             // "idx" | "cifar10" | "npy"
  std::string images;           // idx, npy: images file
  std::string labels;           // idx, npy: labels file
  std::string input;            // cifar10: the binary directory
  std::string split = "train";  // cifar10: "train" | "test"
  std::string out;              // the HDF5 file to write
};

// Writes `args.out` and prints "wrote <out>"; returns the exit code. Throws ConfigError when the
// format is unknown or a file it needs is not given, IoError when a file cannot be read.
int RunConvertCommand(const ConvertArgs& args);

}  // namespace dptrain
