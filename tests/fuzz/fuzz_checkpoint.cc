// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the checkpoint loader. ReadCheckpoint on a file holding the fuzz input; when it
// verifies, MatchCheckpoint against a small model's tensors and DescribeCheckpoint (`dptrain
// inspect`). A dptrain::Error (CheckpointError for a bad file) is the only acceptable failure.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fz = dptrain::fuzz;
  static const std::string path = fz::TempPath("ckpt-00000001.h5");
  fz::WriteFile(path, std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    (void)dptrain::IsCheckpointFile(path);
    const dptrain::Checkpoint ckpt = dptrain::ReadCheckpoint(path);
    const std::vector<dptrain::TensorSpec> params = {
        {"fc.weight", {2, 3}, dptrain::CkptDType::kF32, false},
        {"fc.bias", {2}, dptrain::CkptDType::kF32, false},
        {"bn.num_batches_tracked", {}, dptrain::CkptDType::kI64, true}};
    const std::vector<dptrain::TensorSpec> slots = {
        {"fc.weight/momentum_buffer", {2, 3}, dptrain::CkptDType::kF32, false},
        {"fc.bias/momentum_buffer", {2}, dptrain::CkptDType::kF32, false}};
    try {
      dptrain::MatchCheckpoint(path, ckpt, params, &slots);
    } catch (const dptrain::Error&) {
    }
    (void)dptrain::DescribeCheckpoint(path);
  } catch (const dptrain::Error&) {
  }
  return 0;
}
