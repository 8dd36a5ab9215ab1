// SPDX-License-Identifier: Apache-2.0
// dptrain_hooked: the dptrain command line with test hooks (runtime/train_hooks.h) read from
// DPTRAIN_TEST_* variables, for the end-to-end shell tests that inject faults. Test-only: the
// production binary reads none of these variables.
//   DPTRAIN_TEST_LOSS_SCALING=1                   dynamic loss scaling in fp32 too
//   DPTRAIN_TEST_INF_GRAD=RANK:STEP               an infinite gradient on RANK before step STEP
//   DPTRAIN_TEST_FLIP_PARAM=RANK:STEP             one parameter of RANK nudged after step STEP
//   DPTRAIN_TEST_OOM=RANK:STEP                    an out-of-memory on RANK in step STEP (once)
//   DPTRAIN_TEST_KILL_IN_COLLECTIVE=RANK:STEP     RANK SIGKILLs itself with STEP+1's collectives
//                                                 in flight
//   DPTRAIN_TEST_CHECKPOINT_PAUSE_S=SECONDS       the checkpoint writer pauses mid-file
//   DPTRAIN_TEST_CHECKPOINT_PAUSE_STEP=STEP       ... only in the write of that step
//   DPTRAIN_TEST_SHARE_GPU=1                      ranks may share a GPU (NCCL over sockets)
#include <cstdio>
#include <cstdlib>

#include "launcher/cli.h"

namespace {

// "rank:step" -> both; anything else leaves them unchanged.
void RankStep(const char* name, int* rank, int64_t* step) {
  const char* v = std::getenv(name);
  if (v == nullptr) return;
  int r = -1;
  long long s = -1;
  if (std::sscanf(v, "%d:%lld", &r, &s) == 2) {
    *rank = r;
    *step = s;
  }
}

}  // namespace

int main(int argc, char** argv) {
  dptrain::TrainHooks hooks;
  if (const char* v = std::getenv("DPTRAIN_TEST_LOSS_SCALING")) hooks.loss_scaling = v[0] == '1';
  RankStep("DPTRAIN_TEST_INF_GRAD", &hooks.inf_grad_rank, &hooks.inf_grad_step);
  RankStep("DPTRAIN_TEST_FLIP_PARAM", &hooks.flip_param_rank, &hooks.flip_param_step);
  RankStep("DPTRAIN_TEST_OOM", &hooks.oom_rank, &hooks.oom_step);
  RankStep("DPTRAIN_TEST_KILL_IN_COLLECTIVE", &hooks.kill_rank, &hooks.kill_step);
  if (const char* v = std::getenv("DPTRAIN_TEST_CHECKPOINT_PAUSE_S"); v != nullptr && *v != 0) {
    hooks.checkpoint_pause.seconds = std::atof(v);
  }
  if (const char* v = std::getenv("DPTRAIN_TEST_CHECKPOINT_PAUSE_STEP"); v != nullptr && *v != 0) {
    hooks.checkpoint_pause.step = std::atoll(v);
  }
  if (const char* v = std::getenv("DPTRAIN_TEST_SHARE_GPU")) hooks.share_gpu = v[0] == '1';
  return dptrain::RunCommandLine(argc, argv, hooks);
}
