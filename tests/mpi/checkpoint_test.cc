// SPDX-License-Identifier: Apache-2.0
// Checkpoint resume is exact (STYLE.md section 6): 2N steps straight give bitwise the same
// parameters, batch-norm statistics as N steps, a stop (the preemption path, triggered on the
// LAST rank so the ranks must agree), a resume and N more steps, with train.deterministic on the
// CPU; also when the stop is mid-epoch or at an epoch's end, and for a model with batch norm,
// dropout, AdamW and gradient accumulation. Resuming a 4-rank checkpoint on 2 and 1 ranks
// matches to 1e-5. Plus checkpoint.init and the agreed errors of a checkpoint that cannot
// resume the run. All runs happen inside one 4-rank job on split communicators.
#include "runtime/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <filesystem>

#include "core/backend_registry.h"
#include "launcher/config.h"
#include "runtime/trainer.h"
#include "tests/testing/mpi_testing.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/train_runs.h"

namespace dptrain {
namespace {

using testing::AllRanksOk;
using testing::NamedTensors;
using testing::RunOutcome;
using testing::TrainOnFirstRanks;
using testing::WorldComm;
using testing::WorstRelative;

// ref_cnn on synthetic 1x28x28 data: 512 samples, global batch 32 = 16 steps per epoch.
TrainConfig CnnConfig(const std::string& run_dir, int64_t steps) {
  TrainConfig c;
  c.run_dir = run_dir;
  c.seed = 11;
  c.model.name = "ref_cnn";
  c.data.train = {"synthetic"};
  c.data.synthetic_samples = 512;
  c.data.workers = 2;
  c.data.augment = Augment::kCropFlip;
  c.train.epochs = 0;
  c.train.max_steps = steps;
  c.train.global_batch = 32;
  c.train.lr = 0.05;
  c.train.nesterov = true;
  c.train.schedule = ScheduleKind::kCosine;
  c.train.warmup_steps = 3;
  c.train.log_every_steps = 1000;
  c.train.eval_every_epochs = 0;
  c.train.deterministic = true;
  c.checkpoint.every_epochs = 1;
  c.checkpoint.resume = "auto";
  return c;
}

// Batch norm (running statistics in /params), dropout (counter-based RNG), AdamW (step count),
// a step schedule and 2 micro-steps per step.
TrainConfig BnConfig(const std::string& run_dir, int64_t steps) {
  TrainConfig c = CnnConfig(run_dir, steps);
  c.model.name.clear();
  auto layer = [](const char* type, const char* name, int64_t out = 0, int64_t kernel = 0) {
    LayerSpec l;
    l.type = type;
    l.name = name;
    l.out = out;
    l.kernel = kernel;
    if (l.type == "conv2d") l.pad = 1;
    if (l.type == "dropout") l.p = 0.25;
    return l;
  };
  c.model.layers = {layer("conv2d", "conv", 8, 3), layer("batchnorm", "bn"),
                    layer("relu", "act"),          layer("maxpool", "pool"),
                    layer("flatten", "flat"),      layer("dropout", "drop"),
                    layer("linear", "fc", 10)};
  c.data.augment = Augment::kNone;
  c.train.optimizer = OptimizerKind::kAdamW;
  c.train.lr = 2e-3;
  c.train.weight_decay = 0.01;
  c.train.schedule = ScheduleKind::kStep;
  c.train.step_size = 5;
  c.train.gamma = 0.5;
  c.train.accumulate = 2;
  return c;
}

// Runs `cfg` on the first `world` ranks with checkpoints on (rank 0 writes in cfg.run_dir).
RunOutcome RunOn(int world, const TrainConfig& cfg, int64_t stop_at_step = -1) {
  return TrainOnFirstRanks(WorldComm(), world, cfg, {/*checkpoints=*/true, stop_at_step});
}

using Tensors = NamedTensors;

bool Bitwise(const Tensors& a, const Tensors& b, std::string* where) {
  if (a.size() != b.size() || a.empty()) {
    *where = "tensor count " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || a[i].second.size() != b[i].second.size() ||
        std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.size() * 4) != 0) {
      *where = a[i].first;
      return false;
    }
  }
  return true;
}

class CheckpointResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (WorldComm().size() != 4) GTEST_SKIP() << "needs exactly 4 ranks";
  }
  // Only rank 0 reads and writes checkpoints, so only rank 0's directory is used.
  std::string Dir(const std::string& name) const { return dir_.File(name); }
  testing::TempDir dir_;
};

// Straight 2N vs N + stop + resume + N on `world` ranks: bitwise identical.
void ExpectExactResume(int world, TrainConfig (*make)(const std::string&, int64_t),
                       const std::string& a, const std::string& b, int64_t n, int64_t total) {
  const RunOutcome straight = RunOn(world, make(a, total));
  const RunOutcome stopped = RunOn(world, make(b, total), n);
  const RunOutcome resumed = RunOn(world, make(b, total));
  bool ok = true;
  std::string where = "-", buffers_where = "-";
  if (WorldComm().rank() == 0) {
    ok = straight.exit_code == 0 && stopped.exit_code == 0 && resumed.exit_code == 0;
    ok = ok && straight.result.steps == total && stopped.result.stop_signal == SIGUSR1 &&
         stopped.result.steps == n && resumed.result.resumed_from_step == n &&
         resumed.result.steps == total;
    ok = ok && stopped.result.last_checkpoint == b + "/checkpoints/" + CheckpointFileName(n);
    ok = ok && Bitwise(resumed.result.final_params, straight.result.final_params, &where);
    ok = ok &&
         (straight.result.final_buffers.empty() ||
          Bitwise(resumed.result.final_buffers, straight.result.final_buffers, &buffers_where));
    std::printf("world %d, stop at %lld of %lld: %s\n", world, static_cast<long long>(n),
                static_cast<long long>(total), ok ? "bitwise identical" : "DIFFERENT");
  }
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok))
      << "world " << world << " stop at " << n << ": errors '" << straight.error << "' '"
      << stopped.error << "' '" << resumed.error << "'; stopped at " << stopped.result.steps
      << " (signal " << stopped.result.stop_signal << ", checkpoint "
      << stopped.result.last_checkpoint << "), resumed from " << resumed.result.resumed_from_step
      << "; first difference in " << where << " / buffers " << buffers_where;
}

TEST_F(CheckpointResumeTest, MidEpochStopResumesBitwiseOnOneTwoAndFourRanks) {
  // Epochs have 16 steps: the stop at 12 is mid-epoch and the resumed run crosses an epoch end.
  for (int world : {1, 2, 4}) {
    const std::string tag = std::to_string(world);
    ExpectExactResume(world, CnnConfig, Dir("a" + tag), Dir("b" + tag), 12, 24);
  }
}

TEST_F(CheckpointResumeTest, EpochEndStopResumesBitwise) {
  ExpectExactResume(2, CnnConfig, Dir("a"), Dir("b"), 16, 24);
}

TEST_F(CheckpointResumeTest, BatchNormDropoutAdamWAccumulationResumeBitwise) {
  ExpectExactResume(2, BnConfig, Dir("a"), Dir("b"), 7, 20);
}

TEST_F(CheckpointResumeTest, FourRankCheckpointResumesOnTwoAndOneRanks) {
  const int64_t n = 10, total = 20;
  const RunOutcome straight = RunOn(4, CnnConfig(Dir("a"), total));
  const RunOutcome stopped = RunOn(4, CnnConfig(Dir("b"), total), n);
  const std::string ckpt = Dir("b") + "/checkpoints/" + CheckpointFileName(n);
  TrainConfig on2 = CnnConfig(Dir("c2"), total);
  on2.checkpoint.resume = ckpt;
  TrainConfig on1 = CnnConfig(Dir("c1"), total);
  on1.checkpoint.resume = ckpt;
  const RunOutcome r2 = RunOn(2, on2);
  const RunOutcome r1 = RunOn(1, on1);
  bool ok = true;
  double d2 = 0, d1 = 0;
  std::string w2 = "-", w1 = "-";
  if (WorldComm().rank() == 0) {
    ok = stopped.result.steps == n && r2.result.resumed_from_step == n &&
         r1.result.resumed_from_step == n && r2.result.steps == total && r1.result.steps == total;
    d2 = WorstRelative(r2.result.final_params, straight.result.final_params, &w2);
    d1 = WorstRelative(r1.result.final_params, straight.result.final_params, &w1);
    ok = ok && d2 <= 1e-5 && d1 <= 1e-5;
    std::printf(
        "4-rank checkpoint at step %lld resumed to %lld: 2 ranks %.3g (%s), 1 rank %.3g "
        "(%s) relative to 4 ranks straight\n",
        static_cast<long long>(n), static_cast<long long>(total), d2, w2.c_str(), d1, w1.c_str());
  }
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok))
      << "2 ranks: " << d2 << " at " << w2 << ", 1 rank: " << d1 << " at " << w1 << "; errors '"
      << r2.error << "' '" << r1.error << "'";
}

// dist.shard: the same accumulation/AdamW model with gradients sharded resumes bitwise.
TrainConfig BnShardedConfig(const std::string& run_dir, int64_t steps) {
  TrainConfig c = BnConfig(run_dir, steps);
  c.dist.shard = ShardMode::kGradients;
  c.dist.bucket_mb = 1;
  return c;
}

TEST_F(CheckpointResumeTest, ShardedRunResumesBitwise) {
  ExpectExactResume(2, BnShardedConfig, Dir("a"), Dir("b"), 7, 20);
}

// A checkpoint written by a sharded run is the unsharded format, with the whole optimizer state
// (gathered from the ranks' shards): 4 ranks sharded -> 2 ranks sharded and -> 1 rank
// unsharded continue as the 4-rank unsharded run does.
TEST_F(CheckpointResumeTest, ShardedCheckpointResumesShardedOrNotOnAnyWorld) {
  const int64_t n = 10, total = 20;
  const auto sharded = [&](const std::string& dir, ShardMode mode) {
    TrainConfig c = CnnConfig(dir, total);
    c.train.optimizer = OptimizerKind::kAdamW;
    c.train.lr = 1e-3;
    c.dist.shard = mode;
    c.dist.bucket_mb = 1;
    return c;
  };
  const RunOutcome straight = RunOn(4, sharded(Dir("a"), ShardMode::kNone));
  const RunOutcome plain = RunOn(4, sharded(Dir("p"), ShardMode::kNone), n);
  const RunOutcome stopped = RunOn(4, sharded(Dir("b"), ShardMode::kOptimizer), n);
  const std::string ckpt = Dir("b") + "/checkpoints/" + CheckpointFileName(n);
  TrainConfig on2 = sharded(Dir("c2"), ShardMode::kGradients);
  on2.checkpoint.resume = ckpt;
  TrainConfig on1 = sharded(Dir("c1"), ShardMode::kNone);
  on1.checkpoint.resume = ckpt;
  const RunOutcome r2 = RunOn(2, on2);
  const RunOutcome r1 = RunOn(1, on1);
  bool ok = true;
  double dopt = 0, d2 = 0, d1 = 0;
  std::string wopt = "-", w2 = "-", w1 = "-";
  if (WorldComm().rank() == 0) {
    const auto named = [](const std::vector<CheckpointTensor>& ts) {
      NamedTensors out;
      for (const auto& t : ts) out.emplace_back(t.name, t.f32);
      return out;
    };
    const Checkpoint a = ReadCheckpoint(ckpt);
    const Checkpoint b = ReadCheckpoint(Dir("p") + "/checkpoints/" + CheckpointFileName(n));
    dopt = WorstRelative(named(a.optimizer), named(b.optimizer), &wopt);
    ok = a.optimizer.size() == b.optimizer.size() && dopt <= 1e-5;
    ok = ok && stopped.result.steps == n && r2.result.resumed_from_step == n &&
         r1.result.resumed_from_step == n && r2.result.steps == total && r1.result.steps == total;
    d2 = WorstRelative(r2.result.final_params, straight.result.final_params, &w2);
    d1 = WorstRelative(r1.result.final_params, straight.result.final_params, &w1);
    ok = ok && d2 <= 1e-5 && d1 <= 1e-5;
    std::printf(
        "sharded 4-rank checkpoint: optimizer state %.3g (%s) from the unsharded one; resumed to "
        "%lld on 2 ranks sharded %.3g (%s), on 1 rank %.3g (%s)\n",
        dopt, wopt.c_str(), static_cast<long long>(total), d2, w2.c_str(), d1, w1.c_str());
  }
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok))
      << "optimizer " << dopt << " at " << wopt << "; 2 ranks: " << d2 << " at " << w2
      << ", 1 rank: " << d1 << " at " << w1 << "; errors '" << stopped.error << "' '" << r2.error
      << "' '" << r1.error << "' '" << plain.error << "'";
}

TEST_F(CheckpointResumeTest, InitLoadsParametersOnly) {
  const RunOutcome base = RunOn(2, CnnConfig(Dir("a"), 6));
  TrainConfig cfg = CnnConfig(Dir("b"), 6);
  cfg.checkpoint.init = Dir("a") + "/checkpoints/" + CheckpointFileName(6);
  // Stopped before its first step: the parameters are the file's, the position is 0.
  const RunOutcome init = RunOn(2, cfg, 0);
  std::string where = "-";
  bool ok = true;
  if (WorldComm().rank() == 0) {
    ok = init.exit_code == 0 && init.result.resumed_from_step == -1 && init.result.steps == 0 &&
         Bitwise(init.result.final_params, base.result.final_params, &where);
  }
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok)) << init.error << "; difference in " << where;
}

TEST_F(CheckpointResumeTest, CheckpointThatCannotResumeIsAnAgreedErrorWithCode6) {
  const RunOutcome base = RunOn(2, CnnConfig(Dir("a"), 4));
  const std::string ckpt = Dir("a") + "/checkpoints/" + CheckpointFileName(4);
  TrainConfig batch = CnnConfig(Dir("b"), 8);
  batch.checkpoint.resume = ckpt;
  batch.train.global_batch = 64;
  const RunOutcome r1 = RunOn(4, batch);
  TrainConfig model = CnnConfig(Dir("c"), 8);
  model.checkpoint.resume = ckpt;
  model.model.name = "mlp";
  const RunOutcome r2 = RunOn(4, model);
  // dist.shard: an optimizer that does not match is the same error, sharded or not.
  TrainConfig opt = CnnConfig(Dir("d"), 8);
  opt.checkpoint.resume = ckpt;
  opt.train.optimizer = OptimizerKind::kAdamW;
  opt.dist.shard = ShardMode::kGradients;
  const RunOutcome r3 = RunOn(4, opt);
  // Every rank holds the same error (AgreedError), code 6, naming the file and what differs.
  bool ok = r1.exit_code == kExitCheckpoint && r2.exit_code == kExitCheckpoint &&
            r3.exit_code == kExitCheckpoint &&
            r3.error.find("train.optimizer is sgd in the checkpoint, adamw in this run") !=
                std::string::npos &&
            r1.error.find(CheckpointFileName(4)) != std::string::npos &&
            r1.error.find("train.global_batch is 32 in the checkpoint, 64 in this run") !=
                std::string::npos &&
            r2.error.find("fc3.weight") != std::string::npos &&
            r2.error.find("conv1.weight") != std::string::npos &&
            r2.error.find("mis-shaped: fc1.weight") != std::string::npos;
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok))
      << "rank " << WorldComm().rank() << ": code " << r1.exit_code << " '" << r1.error
      << "'; code " << r2.exit_code << " '" << r2.error << "'; code " << r3.exit_code << " '"
      << r3.error << "'";
}

}  // namespace
}  // namespace dptrain
