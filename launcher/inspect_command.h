// SPDX-License-Identifier: Apache-2.0
// `dptrain inspect FILE`: describes an HDF5 dataset, or a checkpoint (state, tensors with their
// checksum verdicts, the config it was written with).
#pragma once

#include <string>

namespace dptrain {

// Prints the description to stdout; returns the exit code. Throws IoError when the file cannot
// be read.
int RunInspectCommand(const std::string& path);

}  // namespace dptrain
