// SPDX-License-Identifier: Apache-2.0
// dist.shard (ZeRO stages 1 and 2) is the same training: 30 steps of ref_cnn and resnet8 with
// the optimizer state ("optimizer") and also the gradients ("gradients") sharded over 2 and 4
// ranks log the same loss at every step as the unsharded run (relative 1e-5, deterministic), for
// SGD with momentum and for AdamW; also with gradient accumulation (every micro-step's backward
// reduce-scatters with "gradients"), loss scaling's agreed skip and clip_grad_norm. The collectives
// under it: in-place reduce-scatter and all-gather over MPI. All runs happen inside one 4-rank job
// on split communicators.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "core/backend_registry.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/optim/shard_layout.h"
#include "runtime/trainer.h"
#include "tests/testing/mpi_testing.h"
#include "tests/testing/train_runs.h"

namespace dptrain {
namespace {

using testing::AllRanksOk;
using testing::RunOutcome;
using testing::TrainOnFirstRanks;
using testing::WorldComm;
using testing::WorstRelative;

TrainConfig Config(const std::string& model, OptimizerKind opt, ShardMode shard) {
  TrainConfig c;
  c.seed = 5;
  c.model.name = model;
  c.data.train = {"synthetic"};
  c.data.synthetic_samples = 512;
  c.data.workers = 1;
  c.train.epochs = 0;
  c.train.max_steps = 30;
  c.train.global_batch = model == "resnet8" ? 16 : 32;
  c.train.optimizer = opt;
  c.train.lr = opt == OptimizerKind::kAdamW ? 1e-3 : 0.05;
  c.train.weight_decay = 1e-4;
  c.train.schedule = ScheduleKind::kCosine;
  c.train.log_every_steps = 1;  // a loss per step
  c.train.eval_every_epochs = 0;
  c.train.deterministic = true;
  c.dist.check_replicas_every = 10;  // the all-gathered parameters stay identical
  c.dist.bucket_mb = 1;              // several groups, also for these small models
  c.dist.shard = shard;
  c.run_dir = "/nonexistent";
  return c;
}

// The worst relative difference between two runs' per-step losses (infinite when a run failed
// or their lengths differ).
double WorstLossDifference(const RunOutcome& a, const RunOutcome& b) {
  const auto& la = a.result.logged_losses;
  const auto& lb = b.result.logged_losses;
  if (!a.error.empty() || !b.error.empty() || la.size() != lb.size() || la.empty()) {
    return std::numeric_limits<double>::infinity();
  }
  double worst = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    worst = std::max(worst, std::abs(la[i] - lb[i]) / std::max(std::abs(lb[i]), 1e-12));
  }
  return worst;
}

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (WorldComm().size() != 4) GTEST_SKIP() << "needs exactly 4 ranks";
  }

  // `cfg` unsharded and with each dist.shard on `world` ranks: the losses agree at every step
  // to 1e-5 and the final parameters to `params_tolerance`.
  void ExpectSameTraining(int world, TrainConfig cfg, const std::string& what,
                          double params_tolerance = 1e-5) {
    cfg.dist.shard = ShardMode::kNone;
    const RunOutcome none = TrainOnFirstRanks(WorldComm(), world, cfg);
    for (ShardMode mode : {ShardMode::kOptimizer, ShardMode::kGradients}) {
      cfg.dist.shard = mode;
      const RunOutcome sharded = TrainOnFirstRanks(WorldComm(), world, cfg);
      bool ok = true;
      double loss = 0, params = 0;
      std::string where = "-";
      if (WorldComm().rank() == 0) {
        loss = WorstLossDifference(sharded, none);
        params = WorstRelative(sharded.result.final_params, none.result.final_params, &where);
        ok = loss <= 1e-5 && params <= params_tolerance &&
             sharded.result.logged_losses.size() == static_cast<size_t>(cfg.train.max_steps);
        std::printf("%s, %d ranks, shard %s: losses %.3g, parameters %.3g (%s)\n", what.c_str(),
                    world, ConfigName(mode).c_str(), loss, params, where.c_str());
      }
      ASSERT_TRUE(AllRanksOk(WorldComm(), ok))
          << what << " on " << world << " ranks, shard " << ConfigName(mode) << ": losses " << loss
          << ", parameters " << params << " at " << where << "; errors '" << none.error << "' '"
          << sharded.error << "'";
    }
  }
};

TEST_F(ShardTest, RefCnnSgdAndAdamWOnTwoAndFourRanks) {
  for (OptimizerKind opt : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    for (int world : {2, 4}) {
      ExpectSameTraining(world, Config("ref_cnn", opt, ShardMode::kNone),
                         "ref_cnn " + ConfigName(opt));
    }
  }
}

TEST_F(ShardTest, ResNet8SgdAndAdamWOnTwoAndFourRanks) {
  for (OptimizerKind opt : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    for (int world : {2, 4}) {
      TrainConfig c = Config("resnet8", opt, ShardMode::kNone);
      c.train.max_steps = 30;
      ExpectSameTraining(world, c, "resnet8 " + ConfigName(opt));
    }
  }
}

// Issue 63: "gradients" never holds more than "optimizer" at the default dist.bucket_mb, measured
// (the allocator's peak on every rank) and planned alike. A 784-4096-4096-10 MLP with AdamW: one
// layer's gradients are more than sharding the gradients saves on 4 ranks, so "gradients" runs
// as "optimizer" (it peaked 20 MiB above it before); four 2048-wide layers: "gradients" still
// saves memory.
TEST_F(ShardTest, GradientsNeverPeakAboveOptimizer) {
  const auto layer = [](const char* type, int64_t out = 0) {
    LayerSpec l;
    l.type = type;
    l.out = out;
    return l;
  };
  const auto mlp = [&](int64_t width, int hidden) {
    TrainConfig c = Config("ref_cnn", OptimizerKind::kAdamW, ShardMode::kNone);
    c.model.name.clear();
    c.model.layers.push_back(layer("flatten"));
    for (int i = 0; i < hidden; ++i) {
      c.model.layers.push_back(layer("linear", width));
      c.model.layers.push_back(layer("relu"));
    }
    c.model.layers.push_back(layer("linear", 10));
    c.train.max_steps = 1;  // the peak is the first step's
    c.dist.bucket_mb = 25;  // the default
    c.dist.check_replicas_every = 0;
    return c;
  };
  for (const auto& [cfg, saves] : {std::pair{mlp(4096, 2), false}, std::pair{mlp(2048, 4), true}}) {
    int64_t peak[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      TrainConfig c = cfg;
      c.dist.shard = i == 0 ? ShardMode::kOptimizer : ShardMode::kGradients;
      // Plans the backend keeps between runs (the linear layers' workspaces) count in each.
      GetBackend("cpu").ReleasePlans();
      const RunOutcome r = TrainOnFirstRanks(WorldComm(), 4, c);
      ASSERT_TRUE(AllRanksOk(WorldComm(), r.error.empty())) << r.error;
      double most[2] = {static_cast<double>(r.peak_bytes), 0};
      WorldComm().AllReduceHost(most, 2, ReduceOp::kMax);
      peak[i] = static_cast<int64_t>(most[0]);
    }
    const int64_t width = cfg.model.layers[1].out;
    if (WorldComm().rank() == 0) {
      std::printf(
          "MLP of %lld-wide layers on 4 ranks, peak per rank: optimizer %.2f MiB, "
          "gradients %.2f MiB\n",
          static_cast<long long>(width), static_cast<double>(peak[0]) / (1 << 20),
          static_cast<double>(peak[1]) / (1 << 20));
    }
    EXPECT_LE(peak[1], peak[0]) << width << "-wide layers";
    if (saves) {
      EXPECT_LT(peak[1], peak[0] - (int64_t{4} << 20)) << width << "-wide layers";
    }
  }
}

TEST_F(ShardTest, AccumulationAndBf16) {
  // 2 micro-steps per step: "gradients" reduce-scatters after each and adds them up.
  TrainConfig c = Config("ref_cnn", OptimizerKind::kSgd, ShardMode::kNone);
  c.train.accumulate = 2;
  ExpectSameTraining(2, c, "ref_cnn sgd, 2 micro-steps");
  // "gradients" adds the micro-steps' sums ((a1 + b1) + (a2 + b2)) where the others sum each
  // rank's micro-steps first ((a1 + a2) + (b1 + b2)): rounding differences, 1e-7 with SGD
  // above. AdamW divides by the root of the second moment, which turns the rounding noise of a
  // gradient that is almost zero (dead ReLU units feeding fc1.bias) into a full-size step;
  // measured 1e-3 relative in fc1.bias after 30 steps while the losses agree to 1.3e-6.
  c = Config("ref_cnn", OptimizerKind::kAdamW, ShardMode::kNone);
  c.train.accumulate = 2;
  ExpectSameTraining(2, c, "ref_cnn adamw, 2 micro-steps", 1e-2);
  c.train.accumulate = 1;
  c.train.precision = Precision::kBF16;
  ExpectSameTraining(4, c, "ref_cnn adamw bf16");
}

// train.clip_grad_norm with the gradients sharded: the norm is over all parameters, every
// rank's chunks summed (as clip_grad_norm_ after the allreduce), not over a rank's own chunks.
// A limit below the gradients' norm clips every step, so a rank using its own chunks' norm
// would step 1.4-2x too far and the losses would part. With the ImageNet recipe's other knobs
// (label smoothing, no decay on biases and batch norm). The norm sums the ranks' chunks in
// another order than one pass over the flat gradients (double, then the float coefficient): in
// "optimizer" mode that rounding, amplified by 30 steps of batch norm, moved resnet8's
// parameters up to 1.1e-2 relative (a batch-norm bias near zero) while the losses agreed to
// 3.5e-6; "gradients" mode was bit-identical.
TEST_F(ShardTest, ClipGradNormIsTheGlobalNorm) {
  for (const char* model : {"ref_cnn", "resnet8"}) {
    TrainConfig c = Config(model, OptimizerKind::kSgd, ShardMode::kNone);
    c.train.clip_grad_norm = 0.05;
    c.train.label_smoothing = 0.1;
    c.train.no_weight_decay = {"bias", "bn"};
    for (int world : {2, 4}) {
      ExpectSameTraining(world, c, std::string(model) + " sgd, clip_grad_norm 0.05", 5e-2);
    }
  }
}

// fp16 with dynamic loss scaling: an overflow on rank 1 before step 4 (an infinity in the first
// float of its reduced chunks, or of the flat gradients unsharded) is agreed on by every rank
// from their own chunks; the step is skipped and the scale halves as unsharded, so the losses
// after it agree too.
TEST_F(ShardTest, LossScalingSkipsTheSameSteps) {
  TrainConfig c = Config("ref_cnn", OptimizerKind::kSgd, ShardMode::kNone);
  c.train.precision = Precision::kF16;
  c.train.max_steps = 8;
  testing::RunOptions overflow;
  overflow.inf_grad_rank = 1;
  overflow.inf_grad_step = 4;
  const RunOutcome none = TrainOnFirstRanks(WorldComm(), 2, c, overflow);
  for (ShardMode mode : {ShardMode::kOptimizer, ShardMode::kGradients}) {
    c.dist.shard = mode;
    const RunOutcome sharded = TrainOnFirstRanks(WorldComm(), 2, c, overflow);
    bool ok = true;
    double loss = 0;
    if (WorldComm().rank() == 0) {
      loss = WorstLossDifference(sharded, none);
      ok = loss <= 1e-5;
    }
    ASSERT_TRUE(AllRanksOk(WorldComm(), ok))
        << ConfigName(mode) << ": losses " << loss << "; errors '" << none.error << "' '"
        << sharded.error << "'";
  }
}

TEST_F(ShardTest, OneRankIsUnsharded) {
  const RunOutcome plain =
      TrainOnFirstRanks(WorldComm(), 1, Config("ref_cnn", OptimizerKind::kSgd, ShardMode::kNone));
  const RunOutcome one = TrainOnFirstRanks(
      WorldComm(), 1, Config("ref_cnn", OptimizerKind::kSgd, ShardMode::kGradients));
  bool ok = true;
  if (WorldComm().rank() == 0) ok = WorstLossDifference(one, plain) == 0;
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok)) << one.error;
}

// The in-place collectives the sharded reducer uses: chunk r holds the sum of every rank's
// chunk r; the all-gather then restores every chunk everywhere. 3 and 4 ranks (split).
TEST_F(ShardTest, InPlaceReduceScatterAndAllGather) {
  for (int world : {3, 4}) {
    const int r = WorldComm().rank();
    auto sub = WorldComm().SplitMpi(r < world ? 0 : -1);
    bool ok = true;
    if (sub != nullptr) {
      Backend& be = GetBackend("cpu");
      const int64_t chunk = 37;
      Tensor t = be.Empty(Shape{chunk * world}, DType::kF32, "test");
      float* p = t.data<float>();
      for (int64_t i = 0; i < chunk * world; ++i) p[i] = static_cast<float>(i * (r + 1));
      sub->ReduceScatterAsync(&t, ReduceOp::kSum)->Wait();
      const double ranks_sum = world * (world + 1) / 2.0;
      for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) {
        ok = ok && p[i] == static_cast<float>(static_cast<double>(i) * ranks_sum);
      }
      // Every rank's chunk = its rank, gathered.
      for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) p[i] = static_cast<float>(r);
      sub->AllGatherAsync(&t)->Wait();
      for (int64_t i = 0; i < chunk * world; ++i) ok = ok && p[i] == static_cast<float>(i / chunk);
    }
    ASSERT_TRUE(AllRanksOk(WorldComm(), ok)) << "world " << world;
  }
}

TEST(ShardLayoutTest, ChunksTileTheBuffer) {
  const ShardLayout l = ShardLayout::Make({{0, 64}, {64, 192}, {192, 256}}, 1, 4);
  ASSERT_EQ(l.groups.size(), 3u);
  EXPECT_EQ(l.shard_floats, 64);
  EXPECT_EQ(l.OwnBegin(0), 16);
  EXPECT_EQ(l.OwnBegin(1), 96);
  EXPECT_EQ(l.groups[1].shard_offset, 16);
  EXPECT_EQ(l.groups[2].shard_offset, 48);
  EXPECT_THROW(ShardLayout::Make({{0, 10}}, 0, 4), InternalError);  // not 4 chunks
}

}  // namespace
}  // namespace dptrain
