// SPDX-License-Identifier: Apache-2.0
// Data-parallel training is single-process training: 30 steps of ref_cnn on Fashion-MNIST with
// shuffling give the same parameters (relative 1e-4) on 1 rank x global batch 64, 2 ranks x 32
// and 4 ranks x 16. All three runs happen inside one 4-rank job on split communicators; rank 0
// takes part in all of them and compares.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/backend_registry.h"
#include "core/error.h"
#include "launcher/config.h"
#include "runtime/trainer.h"
#include "tests/testing/mpi_testing.h"
#include "tests/testing/train_runs.h"

namespace dptrain {
namespace {

using testing::AllRanksOk;
using testing::NamedTensors;
using testing::RunOutcome;
using testing::TrainOnFirstRanks;
using testing::WorldComm;
using testing::WorstRelative;

std::string DataDir() {
  const char* d = std::getenv("DPTRAIN_DATA");
  return d != nullptr ? d : "data";
}

TrainConfig Config(int64_t steps, int64_t accumulate = 1) {
  TrainConfig c;
  c.model.name = "ref_cnn";
  c.data.train = {DataDir() + "/fmnist/train.h5"};
  c.data.mean = {0.2860};
  c.data.std = {0.3530};
  c.data.workers = 1;
  c.train.epochs = 0;
  c.train.max_steps = steps;
  c.train.global_batch = 64;
  c.train.accumulate = accumulate;
  c.train.lr = 0.05;
  c.train.schedule = ScheduleKind::kCosine;
  c.train.log_every_steps = 1000;
  c.train.eval_every_epochs = 0;
  c.run_dir = "/nonexistent";  // quiet runs write nothing
  return c;
}

using Params = NamedTensors;

// Runs `cfg` on the first `world` ranks; the final parameters on those ranks. An error is
// rethrown, so that the test reports it.
Params RunOn(int world, const TrainConfig& cfg) {
  RunOutcome r = TrainOnFirstRanks(WorldComm(), world, cfg);
  if (!r.error.empty()) throw AgreedError(r.error, r.exit_code);
  return std::move(r.result.final_params);
}

class EquivalenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const bool have = std::filesystem::exists(DataDir() + "/fmnist/train.h5");
    if (!WorldComm().AllTrue(have)) {
      GTEST_SKIP() << "Fashion-MNIST not converted at " << DataDir() << "/fmnist (run `make data`)";
    }
    if (WorldComm().size() != 4) GTEST_SKIP() << "needs exactly 4 ranks";
  }
};

// The same with model.channels_last (NHWC activations between conv1, its pool and conv2).
class EquivalenceLayoutTest : public EquivalenceTest, public ::testing::WithParamInterface<bool> {};

TEST_P(EquivalenceLayoutTest, OneTwoFourRanksGiveTheSameParameters) {
  TrainConfig cfg = Config(30);
  cfg.model.channels_last = GetParam();
  const Params p1 = RunOn(1, cfg);
  const Params p2 = RunOn(2, cfg);
  const Params p4 = RunOn(4, cfg);
  std::string w2, w4;
  double r2 = 0, r4 = 0;
  bool ok = true;
  if (WorldComm().rank() == 0) {
    ok = p1.size() == 8 && p2.size() == 8 && p4.size() == 8;
    r2 = WorstRelative(p2, p1, &w2);
    r4 = WorstRelative(p4, p1, &w4);
    ok = ok && r2 <= 1e-4 && r4 <= 1e-4;
    std::printf("relative difference to 1 rank: 2 ranks %.3g (%s), 4 ranks %.3g (%s)\n", r2,
                w2.c_str(), r4, w4.c_str());
  }
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok))
      << "2 ranks: " << r2 << " at " << w2 << "; 4 ranks: " << r4 << " at " << w4;
}

INSTANTIATE_TEST_SUITE_P(Layouts, EquivalenceLayoutTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "ChannelsLast" : "Nchw";
                         });

TEST_F(EquivalenceTest, AccumulationMatchesTheFullBatch) {
  // 2 ranks x (2 micro-steps of 16) == 1 rank x 64.
  const Params p1 = RunOn(1, Config(10));
  const Params pa = RunOn(2, Config(10, 2));
  std::string w;
  double r = 0;
  bool ok = true;
  if (WorldComm().rank() == 0) {
    r = WorstRelative(pa, p1, &w);
    ok = pa.size() == p1.size() && r <= 1e-4;
  }
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok)) << r << " at " << w;
}

// Issue 13 #10: a micro-step never reads the device. The loss of each micro-step stays there
// until the log line, so device-to-host copies grow with log lines, not micro-steps: 8 more
// steps of 4 micro-steps, logged every 4 steps, add 2 reads (setup and the final parameters
// read the same in both runs), where reading each loss would add 32.
TEST_F(EquivalenceTest, MicroStepsNeverWaitToReadTheLoss) {
  Backend& be = GetBackend("cpu");
  const auto device_reads = [&](int64_t steps, std::string* error) {
    TrainConfig cfg = Config(steps, 4);
    cfg.train.log_every_steps = 4;
    cfg.dist.check_replicas_every = 0;
    be.ResetProfile();
    be.EnableProfiling(true);
    const RunOutcome r = TrainOnFirstRanks(WorldComm(), 2, cfg);
    be.EnableProfiling(false);
    int64_t reads = 0;
    for (const OpStat& s : be.Profile()) {
      if (s.name == "copy_d2h") reads = s.calls;
    }
    be.ResetProfile();
    *error += r.error;
    return reads;
  };
  std::string error;
  const int64_t short_run = device_reads(4, &error);
  const int64_t long_run = device_reads(12, &error);
  const bool ok = WorldComm().rank() >= 2 || (error.empty() && long_run - short_run == 2);
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok))
      << "rank " << WorldComm().rank() << ": " << short_run << " device reads in 4 steps, "
      << long_run << " in 12 " << error;
}

TEST_F(EquivalenceTest, AutoMicrobatchUnderAMemoryLimitMatchesTheFullBatch) {
  // 2 ranks x 128 (34 MiB a rank) does not fit in 24 MiB; auto_microbatch falls back to
  // smaller micro-batches (64 x 2).
  TrainConfig full = Config(8);
  full.train.global_batch = 256;
  const Params p_full = RunOn(2, full);
  Backend& be = GetBackend("cpu");
  TrainConfig limited = full;
  limited.memory.limit = "24MiB";
  limited.memory.limit_bytes = size_t{24} << 20;
  limited.memory.auto_microbatch = true;
  be.allocator().EmptyCache();
  be.allocator().set_budget(limited.memory.limit_bytes);
  Params p_auto;
  std::string error;
  try {
    p_auto = RunOn(2, limited);
  } catch (const Error& e) {
    error = e.what();
  }
  // Without auto_microbatch the same run stops with the OOM report (exit 4) on every rank.
  limited.memory.auto_microbatch = false;
  RunOutcome no_auto = TrainOnFirstRanks(WorldComm(), 2, limited);
  const int code = WorldComm().rank() < 2 ? no_auto.exit_code : 4;
  const std::string oom = WorldComm().rank() < 2 ? no_auto.error : "out of memory";
  be.allocator().set_budget(0);
  std::string w;
  double r = 0;
  bool ok = error.empty() && code == 4 && oom.find("out of memory") != std::string::npos;
  if (WorldComm().rank() == 0) {
    r = WorstRelative(p_auto, p_full, &w);
    ok = ok && p_auto.size() == p_full.size() && r <= 1e-5;
    std::printf("auto micro-batch vs full batch: relative %.3g (%s)\n", r, w.c_str());
  }
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok)) << "error '" << error << "', oom exit " << code << " '"
                                           << oom << "', rel " << r << " at " << w;
}

}  // namespace
}  // namespace dptrain
