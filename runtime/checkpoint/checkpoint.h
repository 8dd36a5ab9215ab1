// SPDX-License-Identifier: Apache-2.0
// Checkpoints in a training run (DESIGN.md section 4): matching a checkpoint against a model so
// that every missing, unexpected and mis-shaped tensor is reported in one message, and the
// background writer rank 0 saves through. The file format itself (Checkpoint, WriteCheckpoint,
// ReadCheckpoint, FindLatestCheckpoint, ...) is core/hdf5/checkpoint_file.h, included here so
// users of this header see both. No HDF5 types here.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/hdf5/checkpoint_file.h"

namespace dptrain {

// A tensor a model expects.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  CheckpointDType dtype = CheckpointDType::kF32;
  bool optional = false;  // may be missing (num_batches_tracked: dptrain does not use it)
};

// Compares a checkpoint's tensors with what the model expects: /params with `params` and, when
// `optimizer` is not null, /optimizer with it. Throws CheckpointError listing, in ONE message
// naming `path`, every missing, unexpected, mis-shaped and wrongly typed tensor of both groups
// by name, with the shape in the file and in the model.
void MatchCheckpoint(const std::string& path, const Checkpoint& ckpt,
                     const std::vector<TensorSpec>& params,
                     const std::vector<TensorSpec>* optimizer);

// Writes checkpoints from a background thread so that training (and the other ranks) never
// waits for the disk: Submit() hands over a host snapshot and returns; a later Submit() or
// Wait() blocks until the previous write is done. One owner thread calls the methods.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, int64_t keep, CheckpointPauseHook pause = {});
  // Waits for a write in progress; its error, if any, is dropped (call Wait() to see it).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the previous write, then starts writing `ckpt`. When the previous write failed,
  // `ckpt` is dropped and the error stays pending (failed() is true, Wait() rethrows it): the
  // caller reports it where every rank can agree on it, never from here.
  void Submit(Checkpoint ckpt);
  // Blocks until no write is in progress. Rethrows the CheckpointError of a failed write (once).
  void Wait();
  // Non-blocking: a write finished with an error that Wait() has not rethrown yet.
  bool failed() const { return failed_.load(); }
  // Non-blocking: statistics of writes completed since the last call (for reporting).
  std::vector<CheckpointWriteStats> TakeCompleted();

 private:
  void Run(const Checkpoint& ckpt);

  std::string dir_;
  int64_t keep_;
  CheckpointPauseHook pause_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<CheckpointWriteStats> completed_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

}  // namespace dptrain
