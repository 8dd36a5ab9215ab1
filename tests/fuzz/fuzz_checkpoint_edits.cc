// SPDX-License-Identifier: Apache-2.0
// Fuzz target, structure-aware: a valid checkpoint written by WriteCheckpoint (a small model:
// fc.weight, fc.bias, bn.num_batches_tracked, SGD momentum, /state, /config), then well-formed
// edits of it through the HDF5 API (hdf5_edits.h), optionally with every crc32 attribute
// recomputed so that edited tensors pass their checksums, then the loader (readers.h). The file
// is always valid HDF5, so what is fuzzed is dptrain's validation of its contents.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/hdf5_edits.h"
#include "tests/fuzz/readers.h"

namespace {

// The bytes of a valid checkpoint, written once per process.
const std::string& SeedBytes() {
  static const std::string bytes = [] {
    dptrain::Checkpoint c;
    c.state.step = 7;
    c.state.epoch = 1;
    c.state.samples_in_epoch = 12;
    c.state.seed = 5;
    c.state.world_size_at_save = 2;
    c.state.global_batch = 4;
    c.state.dataset_size = 20;
    c.state.steps_per_epoch = 5;
    c.state.optimizer_steps = 7;
    c.state.optimizer = "sgd";
    c.state.schedule = "cosine";
    c.state.lr = 0.05;
    c.config_toml = "[model]\nname = \"linear\"\n";
    c.optimizer_kind = "sgd";
    using dptrain::CheckpointDType;
    c.params = {{"bn.num_batches_tracked", CheckpointDType::kI64, {}, {}, {7}},
                {"fc.bias", CheckpointDType::kF32, {2}, {0.5f, -0.5f}, {}},
                {"fc.weight", CheckpointDType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6}, {}}};
    c.optimizer = {
        {"fc.bias/momentum_buffer", CheckpointDType::kF32, {2}, {0.1f, 0.2f}, {}},
        {"fc.weight/momentum_buffer", CheckpointDType::kF32, {2, 3}, {0, 1, 0, 1, 0, 1}, {}}};
    const std::string dir = dptrain::fuzz::TempPath("seed");
    dptrain::WriteCheckpoint(dir, c, 1);
    std::ifstream f(dir + "/" + dptrain::CheckpointFileName(7), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }();
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fz = dptrain::fuzz;
  static const std::string path = fz::TempPath("ckpt-00000007.h5");
  static const std::vector<std::string> kNames = {"params",
                                                  "optimizer",
                                                  "state",
                                                  "config",
                                                  "crc32",
                                                  "kind",
                                                  "steps",
                                                  "format_version",
                                                  "dptrain_version",
                                                  "created",
                                                  "step",
                                                  "epoch",
                                                  "samples_in_epoch",
                                                  "seed",
                                                  "world_size_at_save",
                                                  "global_batch",
                                                  "accumulate",
                                                  "dataset_size",
                                                  "steps_per_epoch",
                                                  "optimizer_steps",
                                                  "schedule",
                                                  "lr",
                                                  "last_eval_step",
                                                  "elapsed_s",
                                                  "loss_scale",
                                                  "loss_scale_good_steps",
                                                  "skipped_steps",
                                                  "micro_batch",
                                                  "/params/fc.weight",
                                                  "/params/fc.bias",
                                                  "/params/bn.num_batches_tracked",
                                                  "/params/module.fc.weight",
                                                  "/optimizer/fc.weight/momentum_buffer",
                                                  "/optimizer/fc.weight/exp_avg",
                                                  "fc.weight",
                                                  "module.fc.bias"};
  const std::string& seed = SeedBytes();
  if (seed.empty()) __builtin_trap();  // the harness could not write its seed
  FuzzedDataProvider in(data, size);
  fz::WriteFile(path, seed);
  fz::EditHdf5(path, in, kNames, 5);
  if (in.ConsumeBool()) fz::FixCrc32Attributes(path);
  fz::ExerciseCheckpointFile(path);
  return 0;
}
