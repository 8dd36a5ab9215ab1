// SPDX-License-Identifier: Apache-2.0
// Fuzz target: ConvertIdx on an images file and a labels file (the input split by
// fuzz::kSeparator; gzip or plain). A dptrain::Error is the only acceptable failure.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "datasets/convert/convert.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fz = dptrain::fuzz;
  static const std::string images = fz::TempPath("images.idx");
  static const std::string labels = fz::TempPath("labels.idx");
  static const std::string out = fz::TempPath("out.h5");
  const auto parts = fz::Split(std::string_view(reinterpret_cast<const char*>(data), size), 2);
  fz::WriteFile(images, parts[0]);
  fz::WriteFile(labels, parts.size() > 1 ? parts[1] : std::string_view());
  try {
    dptrain::ConvertIdx(images, labels, out);
  } catch (const dptrain::Error&) {
  }
  return 0;
}
