// SPDX-License-Identifier: Apache-2.0
// Fuzz target, structure-aware: a valid dataset file whose layout the input chooses (uint8 or
// float32 images, N, C, H, W, chunk rows, classes, mean / std), then well-formed edits of it
// through the HDF5 API (hdf5_edits.h), then OpenHdf5Dataset and a Read (readers.h). The file is
// always valid HDF5, so what is fuzzed is dptrain's validation of its contents.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "datasets/hdf5_writer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/hdf5_edits.h"
#include "tests/fuzz/readers.h"

namespace {

void WriteSeed(const std::string& path, FuzzedDataProvider& in) {
  const auto n = in.ConsumeIntegralInRange<int64_t>(1, 9);
  const auto c = in.ConsumeIntegralInRange<int64_t>(1, 3);
  const auto h = in.ConsumeIntegralInRange<int64_t>(1, 6);
  const auto w = in.ConsumeIntegralInRange<int64_t>(1, 6);
  const auto classes = in.ConsumeIntegralInRange<int64_t>(1, 12);
  const bool f32 = in.ConsumeBool();
  const size_t numel = static_cast<size_t>(n * c * h * w);
  std::vector<uint8_t> images(numel * (f32 ? 4 : 1));
  if (f32) {
    auto* p = reinterpret_cast<float*>(images.data());
    for (size_t i = 0; i < numel; ++i) p[i] = in.ConsumeProbability<float>();
  } else {
    for (uint8_t& b : images) b = in.ConsumeIntegral<uint8_t>();
  }
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int32_t& l : labels)
    l = in.ConsumeIntegralInRange<int32_t>(0, static_cast<int32_t>(classes - 1));
  dptrain::Hdf5Writer out(path);
  out.WriteArray("/images", f32 ? dptrain::H5Elem::kF32 : dptrain::H5Elem::kU8, {n, c, h, w},
                 images.data(), in.ConsumeIntegralInRange<int64_t>(0, n));
  out.WriteArray("/labels", dptrain::H5Elem::kI32, {n}, labels.data(),
                 in.ConsumeIntegralInRange<int64_t>(0, n));
  if (in.ConsumeBool()) out.SetIntAttr("/", "classes", classes);
  if (in.ConsumeBool()) {
    out.SetFloatsAttr("/", "mean", std::vector<float>(static_cast<size_t>(c), 0.5f));
    out.SetFloatsAttr("/", "std", std::vector<float>(static_cast<size_t>(c), 0.25f));
  }
  out.Close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fz = dptrain::fuzz;
  static const std::string path = fz::TempPath("edited-dataset.h5");
  static const std::vector<std::string> kNames = {"images",  "labels",  "classes", "mean", "std",
                                                  "/images", "/labels", "data",    "x",    "y"};
  FuzzedDataProvider in(data, size);
  WriteSeed(path, in);
  fz::EditHdf5(path, in, kNames, 4);
  fz::ExerciseDatasetFile(path);
  return 0;
}
