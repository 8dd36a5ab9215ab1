// SPDX-License-Identifier: Apache-2.0
// Structure-aware fuzzing of HDF5 readers: well-formed edits of a valid HDF5 file, chosen by the
// fuzz input and made through the HDF5 API (delete, move or replace objects and attributes,
// change types, shapes and values, add unexpected ones). The file stays valid HDF5, so the
// fuzzer explores dptrain's validation of what a file holds rather than libhdf5's parsing of
// corrupt bytes, which has bugs of its own in 1.10 (tests/fuzz/open-findings/).
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

namespace dptrain::fuzz {

// Applies up to `max_edits` edits to the HDF5 file at `path`. `names` are the link and
// attribute names (and slash paths) the reader knows; new objects and attributes are mostly
// given one of them so that the edits reach the reader's checks. Aborts if the file cannot be
// opened (a harness problem, not a finding).
void EditHdf5(const std::string& path, FuzzedDataProvider& in,
              const std::vector<std::string>& names, int max_edits);

// Recomputes the `crc32` attribute of every dataset that has one (float32 / int64 data), so
// that edited tensors pass their checksums and the checks behind them are reached.
void FixCrc32Attributes(const std::string& path);

}  // namespace dptrain::fuzz
