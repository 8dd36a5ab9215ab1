// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the checkpoint loader on a file holding the fuzz input as raw bytes (see
// readers.h for what is exercised). libhdf5 1.10 itself has bugs on corrupt files (see
// tests/fuzz/open-findings/), so CI replays this corpus only; fuzz_checkpoint_edits fuzzes the
// same loader with well-formed files.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/readers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = dptrain::fuzz::TempPath("ckpt-00000001.h5");
  dptrain::fuzz::WriteFile(path, std::string_view(reinterpret_cast<const char*>(data), size));
  dptrain::fuzz::ExerciseCheckpointFile(path);
  return 0;
}
