// SPDX-License-Identifier: Apache-2.0
// Whether a path can be read as an input file, said once for every reader (HDF5 datasets and
// checkpoints, idx, .npy, CIFAR-10 batches).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dptrain {

// Why `path` cannot be read as `what` ("an HDF5 file"), or "" when it can be opened for reading.
// One of: "no such file"; "is a directory, expected <what>"; "cannot read the file: it is not a
// regular file (a FIFO, socket or device); give <what>"; "cannot read the file: <strerror>"
// (e.g. Permission denied). The type is checked with stat before any open: opening a FIFO for
// reading waits for a writer (a hang), and opening a device has effects of its own; the open
// that follows is non-blocking and checked again with fstat, so a swap between the two is seen
// (a reader that opens the path again does not see a swap after this check: OpenInputFile and
// ReadInputFile hand over the checked descriptor). Callers throw "<path>: <reason>" with their own
// error class.
std::string InputFileProblem(const std::string& path, std::string_view what);

// The descriptor InputFileProblem's checks ran on (read-only, blocking, close-on-exec), for a
// reader that reads in pieces (e.g. gzdopen): the caller owns it. -1 and *why set (as
// InputFileProblem's reason) when the file cannot be read.
int OpenInputFile(const std::string& path, std::string_view what, std::string* why);

// The whole of `path` into *bytes, read from the descriptor InputFileProblem's checks ran on:
// one open, and nothing swapped in after the check is read. "" or the reason, as
// InputFileProblem's, or "cannot read the file: <strerror>" for a failed read, or "is N bytes,
// more than the <max_bytes> bytes <what> can be" (checked before reading).
std::string ReadInputFile(const std::string& path, std::string_view what,
                          std::vector<uint8_t>* bytes, size_t max_bytes = SIZE_MAX);

}  // namespace dptrain
