// SPDX-License-Identifier: Apache-2.0
// TrainHooks: what tests inject into a training run (faults, pauses, a quiet mode, the final
// parameters). Production code never fills it in: the `dptrain` binary passes a default
// TrainHooks, which changes nothing. Tests fill it in directly (gtest and MPI tests) or through
// the test-only binary tests/testing/dptrain_hooked_main.cc, which reads DPTRAIN_TEST_* variables
// for the end-to-end shell tests. No production code reads those variables.
#pragma once

#include <cstdint>

#include "core/hdf5/checkpoint_file.h"  // CheckpointPauseHook

namespace dptrain {

struct TrainHooks {
  bool quiet = false;  // no output, no run_dir files, no checkpoint reads or writes
  // With `quiet`, rank 0 still resumes from (or initialises with) checkpoints and writes them to
  // run_dir/checkpoints.
  bool quiet_checkpoints = false;
  // Return the final parameters and buffers in TrainResult.
  bool keep_final_params = false;
  // >= 0: the last rank acts as if a preemption signal (SIGUSR1) arrived just before optimizer
  // step `stop_at_step` (0-based count of steps done): training stops there as on a real signal.
  int64_t stop_at_step = -1;
  // Dynamic loss scaling in fp32 too (it is always on in fp16), so the step of an overflow is
  // the injected one.
  bool loss_scaling = false;
  // An infinity written into the first gradient of rank `inf_grad_rank` once `inf_grad_step`
  // steps are done, so step inf_grad_step + 1 (counted from 1, as messages and metrics.jsonl
  // count) sees an overflow on one rank; -1 = never.
  int inf_grad_rank = -1;
  int64_t inf_grad_step = -1;
  // The first parameter of rank `flip_param_rank` nudged by one ulp after optimizer step
  // `flip_param_step` (silent corruption of one replica); -1 = never.
  int flip_param_rank = -1;
  int64_t flip_param_step = -1;
  // An out-of-memory thrown on rank `oom_rank` in the first micro-step once `oom_step` steps
  // are done (step oom_step + 1, counted from 1), once: what memory.auto_microbatch recovers
  // from mid-run; -1 = never.
  int oom_rank = -1;
  int64_t oom_step = -1;
  // Rank `kill_rank` kills itself (SIGKILL) in step kill_step + 1 (counted from 1) once its
  // backward has enqueued the step's gradient collectives, before it waits for them: a rank
  // lost mid-allreduce while its peers are inside the same collectives; -1 = never.
  int kill_rank = -1;
  int64_t kill_step = -1;
  CheckpointPauseHook checkpoint_pause;
  // Two or more ranks may share one GPU: the uniqueness check lets them through and each rank's
  // NCCL talks to the others as another host, over sockets on loopback (ShareGpuOverNcclSockets,
  // launcher/gpu_binder.h). For a GPU machine with one GPU; users sharing a GPU get the error.
  bool share_gpu = false;
};

}  // namespace dptrain
