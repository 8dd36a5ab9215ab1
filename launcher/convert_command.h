// SPDX-License-Identifier: Apache-2.0
// `dptrain convert --from idx|cifar10|npy|imagefolder ... --out FILE`: a dataset to dptrain's
// HDF5 format.
#pragma once

#include <cstdint>
#include <string>

namespace dptrain {

struct ConvertArgs {
  std::string from;             // "idx" | "cifar10" | "npy" | "imagefolder"
  std::string images;           // idx, npy: images file
  std::string labels;           // idx, npy: labels file
  std::string input;            // cifar10: the binary directory; imagefolder: DIR/<class>/<image>
  std::string split = "train";  // cifar10: "train" | "test"
  std::string out;              // the HDF5 file to write (imagefolder: shard name base)
  std::string layout = "auto";  // npy: --layout auto | nchw | nhwc (rank-4 images)
  // imagefolder only:
  int64_t size = 0;        // --size S (required): images become S x S
  std::string shard_size;  // --shard-size "10GB" (B, KB, MB, GB, KiB, MiB, GiB); empty: one file
  bool skip_bad = false;   // --skip-bad: leave unreadable images out, listed at the end
  int threads = 0;         // --threads N; 0: all cores
};

// Writes `args.out` (imagefolder: its shards) and prints "wrote <file>" for each file; returns
// the exit code. imagefolder also prints the shards kept from an earlier run, the images left
// out (--skip-bad) and a progress line on stderr (a live line on a terminal, else every ~10%).
// Throws ConfigError when the format is unknown, a file or option it needs is not given, or an
// option belongs to another format; IoError / DataError when an input cannot be read.
int RunConvertCommand(const ConvertArgs& args);

}  // namespace dptrain
