// SPDX-License-Identifier: Apache-2.0
// Fuzz target: ConvertCifar10. One part (no fuzz::kSeparator in the input) is test_batch.bin,
// converted as split "test"; with separators the parts are data_batch_1.bin .. data_batch_5.bin
// (missing ones absent), converted as split "train". A dptrain::Error is the only acceptable
// failure.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.h"
#include "datasets/convert/convert.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fz = dptrain::fuzz;
  static const std::string dir = fz::TempPath("cifar");
  static const std::string out = fz::TempPath("out.h5");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directory(dir, ec);
  const auto parts = fz::Split(std::string_view(reinterpret_cast<const char*>(data), size), 5);
  std::string split = "test";
  if (parts.size() == 1) {
    fz::WriteFile(dir + "/test_batch.bin", parts[0]);
  } else {
    split = "train";
    for (size_t i = 0; i < parts.size(); ++i) {
      fz::WriteFile(dir + "/data_batch_" + std::to_string(i + 1) + ".bin", parts[i]);
    }
  }
  try {
    dptrain::ConvertCifar10(dir, split, out);
  } catch (const dptrain::Error&) {
  }
  return 0;
}
