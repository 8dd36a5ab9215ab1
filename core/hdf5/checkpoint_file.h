// SPDX-License-Identifier: Apache-2.0
// The checkpoint file format (DESIGN.md sections 4 and 5), with no model knowledge: the training
// state as host arrays (Checkpoint), written atomically (temporary name, fsync, rename, fsync of
// the directory), read back with every tensor's checksum verified, listed, found ("latest that
// verifies") and described for `dptrain inspect`. No HDF5 types here. Matching a checkpoint
// against a model and the background writer are runtime/checkpoint/checkpoint.h.
//
// File layout (readable by h5py with no dptrain code; docs/checkpoints.md):
//   /params/<name>              float32 parameters and batch-norm running_mean / running_var in
//                               PyTorch layouts, plus int64 scalars <bn>.num_batches_tracked: the
//                               group maps 1:1 onto the equivalent torch module's state_dict()
//   /optimizer/<name>/<slot>    float32 optimizer state per parameter (momentum_buffer; exp_avg,
//                               exp_avg_sq); attributes kind, steps
//   /state                      group of attributes: the position and provenance (CheckpointState)
//   /config                     the resolved TOML text of the run
// Every tensor carries an attribute `crc32` (uint32, zlib's CRC-32 of its little-endian bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dptrain {

inline constexpr int64_t kCheckpointFormatVersion = 1;

enum class CheckpointDType : uint8_t { kF32, kI64 };

// One tensor of a checkpoint, on the host.
struct CheckpointTensor {
  // Below its group: "conv1.weight", "bn1.num_batches_tracked"; in /optimizer
  // "<param name>/<slot>", e.g. "conv1.weight/momentum_buffer".
  std::string name;
  CheckpointDType dtype = CheckpointDType::kF32;
  std::vector<int64_t> shape;  // empty = scalar
  std::vector<float> f32;      // dtype kF32: numel() values in C order
  std::vector<int64_t> i64;    // dtype kI64: numel() values
  int64_t numel() const;
};

// Where training stands and how it was run; the /state attributes. Everything a resume needs
// besides the tensors: all randomness in dptrain is counter-based on (seed, epoch, step, global
// sample index), so the seed is the whole RNG state.
struct CheckpointState {
  int64_t step = 0;              // optimizer steps completed
  int64_t epoch = 0;             // completed epochs = 0-based index of the epoch in progress
  int64_t samples_in_epoch = 0;  // global samples of that epoch consumed (k * global_batch)
  int64_t seed = 0;
  int64_t world_size_at_save = 1;
  int64_t global_batch = 0;
  int64_t accumulate = 1;
  int64_t dataset_size = 0;  // training samples: the epoch permutation depends on it
  int64_t steps_per_epoch = 0;
  int64_t optimizer_steps = 0;  // Optimizer::steps() (AdamW bias correction)
  std::string optimizer;        // "sgd" | "adamw"
  std::string schedule;         // train.schedule; its position is `step`
  double lr = 0;                // learning rate of the last step taken
  int64_t last_eval_step = -1;  // step of the last evaluation, -1 = none
  double elapsed_s = 0;         // training time of all sessions up to this checkpoint
  double loss_scale = 0;        // fp16 dynamic loss scale (0 = no loss scaling)
  int64_t loss_scale_good_steps = 0;
  int64_t skipped_steps = 0;  // steps skipped for non-finite gradients (loss scaling)
  int64_t micro_batch = 0;    // the micro-batch trained with (memory.auto_microbatch)
  int64_t format_version = kCheckpointFormatVersion;
  std::string dptrain_version;  // filled by the writer when empty
  std::string created;          // UTC time of the save, ISO 8601; filled by the writer
};

struct Checkpoint {
  CheckpointState state;
  // False for a file without /state (e.g. exported from PyTorch with h5py): usable as
  // checkpoint.init only.
  bool has_state = true;
  std::string config_toml;
  // The training set's class names in label order (root attribute class_names, the names joined
  // by "\n", as in dataset files); empty when the data had none.
  std::vector<std::string> class_names;
  std::string optimizer_kind;               // /optimizer attribute `kind`; empty when absent
  std::vector<CheckpointTensor> params;     // /params, sorted by name after reading
  std::vector<CheckpointTensor> optimizer;  // /optimizer, sorted by name after reading
  // What reading noticed and fixed, for the caller to print ("... 'module.' prefix stripped").
  std::vector<std::string> notices;

  // nullptr when absent. The vectors must be sorted by name (as ReadCheckpoint leaves them).
  const CheckpointTensor* FindParam(const std::string& name) const;
  const CheckpointTensor* FindOptimizer(const std::string& name) const;
};

// "ckpt-00001200.h5" (8 digits, more when the step needs them).
std::string CheckpointFileName(int64_t step);

// CRC-32 (zlib polynomial) of `bytes` bytes, as Python's zlib.crc32.
uint32_t Crc32(const void* data, size_t bytes);
// The crc32 attribute of a tensor: Crc32 of its values' little-endian bytes.
uint32_t CheckpointTensorCrc(const CheckpointTensor& t);

// For messages: "[32, 1, 3, 3]", "float32" / "int64".
std::string CheckpointShapeString(const std::vector<int64_t>& shape);
const char* CheckpointDTypeName(CheckpointDType d);

// Test hook (filled in only by tests, through TrainHooks in runtime/train_hooks.h): pauses the
// checkpoint writer once half of the temporary file is written and synced, printing
// "test hook: pausing <s> s while writing <tmp> (pid N)" to stderr first: makes "kill the writer
// mid-file" tests certain.
struct CheckpointPauseHook {
  double seconds = 0;  // 0 = never pause
  int64_t step = -1;   // only in the write of this step; -1 = in every write
};

struct CheckpointWriteStats {
  int64_t step = 0;                  // the checkpoint's step
  std::string path;                  // the complete checkpoint
  int64_t bytes = 0;                 // its size
  double seconds = 0;                // writing, fsyncs and rename
  std::vector<std::string> deleted;  // older checkpoints removed by `keep`
  std::vector<std::string> notices;  // e.g. an old checkpoint that could not be deleted
};

// Writes `ckpt` to dir/ckpt-<state.step>.h5 atomically: the HDF5 file is built in memory, written
// to dir/.ckpt-<step>.h5.tmp, fsynced and renamed, then dir is fsynced; a crash at any point leaves
// either the previous files or the complete new one, never a torn file under the final name.
// Creates `dir` when missing. Afterwards keeps the `keep` checkpoints with the highest steps (the
// new one always stays), deleting the others. Blocking; safe to call from a background thread.
// Throws CheckpointError (exit 6) naming the file and the cause (e.g. "No space left on device");
// the temporary file is removed and existing checkpoints are untouched. `pause` is a test hook
// (CheckpointPauseHook above): it sleeps once half of the temporary file is written and synced.
CheckpointWriteStats WriteCheckpoint(const std::string& dir, const Checkpoint& ckpt, int64_t keep,
                                     const CheckpointPauseHook& pause = {});

// Reads a whole checkpoint and verifies it: structure, dtypes (float32 / int64), every tensor's
// crc32, /state attributes and format_version (files without /state are accepted, see
// Checkpoint::has_state; their tensors may lack checksums). A uniform "module." prefix on every
// name of a group (a DataParallel/DDP wrapper) is stripped with a notice. Throws CheckpointError
// naming the file and every corrupt tensor in one message: missing / not HDF5 / truncated file,
// checksum mismatch, unreadable tensor, unsupported dtype, newer format.
Checkpoint ReadCheckpoint(const std::string& path);

// The complete checkpoint files in `dir` (names matching ckpt-<digits>.h5; temporary files are
// never listed), highest step first. Empty when `dir` does not exist.
std::vector<std::string> ListCheckpoints(const std::string& dir);

// resume = "auto": the newest checkpoint in `dir` that reads and verifies (ReadCheckpoint).
// Files that fail are skipped, each reported in `skipped` as "PATH: why". nullopt when none.
struct FoundCheckpoint {
  std::string path;
  Checkpoint ckpt;
};
std::optional<FoundCheckpoint> FindLatestCheckpoint(const std::string& dir,
                                                    std::vector<std::string>* skipped);

// Removes temporary files (.ckpt-*.h5.tmp) a killed writer left in `dir`; returns their paths.
// Only the one process that writes to `dir` may call it (rank 0, before its first write).
std::vector<std::string> RemoveStaleTemporaries(const std::string& dir);

// True when `path` is an HDF5 file with a /params group (a checkpoint or a parameters file).
bool IsCheckpointFile(const std::string& path);

// `dptrain inspect` for checkpoints: file, format version, step, epoch and the rest of /state,
// every tensor with shape, dtype and checksum verdict, optimizer slots, then the config text.
// Throws CheckpointError when the file cannot be opened.
std::string DescribeCheckpoint(const std::string& path);

}  // namespace dptrain
