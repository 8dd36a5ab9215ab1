// SPDX-License-Identifier: Apache-2.0
// Whether a path can be read as an input file, said once for every reader (HDF5 datasets and
// checkpoints, idx, .npy, CIFAR-10 batches).
#pragma once

#include <string>
#include <string_view>

namespace dptrain {

// Why `path` cannot be read as `what` ("an HDF5 file"), or "" when it can be opened for reading.
// One of: "no such file"; "is a directory, expected <what>"; "cannot read the file: it is not a
// regular file (a FIFO, socket or device); give <what>"; "cannot read the file: <strerror>"
// (e.g. Permission denied). The type is checked with stat before any open: opening a FIFO for
// reading waits for a writer (a hang), and opening a device has effects of its own; the open
// that follows is non-blocking and checked again with fstat, so a swap between the two is seen
// (the caller opens the path again: a swap after this check is not). Callers throw
// "<path>: <reason>" with their own error class.
std::string InputFileProblem(const std::string& path, std::string_view what);

}  // namespace dptrain
