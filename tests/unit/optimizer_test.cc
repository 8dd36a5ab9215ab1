// SPDX-License-Identifier: Apache-2.0
// Optimizer steps against hand-computed values (PyTorch semantics) and learning-rate schedules
// at their boundaries.
#include "runtime/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/backend_registry.h"
#include "tests/testing/backends.h"

namespace dptrain {
namespace {

using testing::ToDevice;
using testing::ToHost;

TEST(OptimizerTest, SgdMomentumMatchesHandComputed) {
  Backend& be = GetBackend("cpu");
  Tensor p = ToDevice(be, std::vector<float>{1.f, -2.f}, Shape{2});
  Tensor g = ToDevice(be, std::vector<float>{0.5f, 1.f}, Shape{2});
  OptimizerConfig c;
  c.momentum = 0.9;
  c.weight_decay = 0.1;
  Optimizer opt(be, c, p);
  // step 1: d = g*scale + wd*p = 0.25 + 0.1 = 0.35; buf = 0.35; p = 1 - 0.1*0.35 = 0.965
  opt.Step(&p, g, 0.1f, 0.5f);
  auto v = ToHost(be, p);
  EXPECT_NEAR(v[0], 0.965f, 1e-6);
  // p1: d = 0.5 + 0.1*(-2) = 0.3; p = -2 - 0.03 = -2.03
  EXPECT_NEAR(v[1], -2.03f, 1e-6);
  // step 2 on p0: d = 0.25 + 0.0965 = 0.3465; buf = 0.9*0.35 + 0.3465 = 0.6615; p = 0.965 - 0.06615
  opt.Step(&p, g, 0.1f, 0.5f);
  v = ToHost(be, p);
  EXPECT_NEAR(v[0], 0.965f - 0.06615f, 1e-6);
  EXPECT_EQ(opt.steps(), 2);
}

// train.no_weight_decay: the flat ranges listed take no decay, SGD (with its momentum state cut
// the same way) and AdamW alike; the rest decays as before.
TEST(OptimizerTest, NoDecayRangesSkipWeightDecay) {
  Backend& be = GetBackend("cpu");
  for (const OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    SCOPED_TRACE(kind == OptimizerKind::kSgd ? "sgd" : "adamw");
    const std::vector<float> start = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    Tensor p = ToDevice(be, start, Shape{10});
    Tensor g = ToDevice(be, std::vector<float>(10, 0.f), Shape{10});
    OptimizerConfig c;
    c.kind = kind;
    c.momentum = 0.9;
    c.weight_decay = 0.5;
    c.no_decay = {{2, 4}, {6, 10}};  // up to the end
    Optimizer opt(be, c, p);
    opt.Step(&p, g, 0.1f, 1.f);
    const std::vector<float> got = ToHost(be, p);
    for (int64_t i = 0; i < 10; ++i) {
      const bool decays = i < 2 || (i >= 4 && i < 6);
      // SGD: p -= lr * wd * p; AdamW: p *= 1 - lr * wd (zero gradient: no Adam step).
      const float want = decays ? start[i] * (1.f - 0.05f) : start[i];
      EXPECT_NEAR(got[i], want, 1e-6) << "element " << i;
    }
  }
}

// LARS: the first tensor (|w| = 5, |g| = 1) is scaled by its trust ratio
// 0.01 * 5 / (1 + 0.1 * 5 + 1e-8); the second is excluded (no decay, no adaptation).
TEST(OptimizerTest, LarsScalesEachTensorByItsTrustRatio) {
  Backend& be = GetBackend("cpu");
  Tensor p = ToDevice(be, std::vector<float>{3.f, 4.f, 2.f}, Shape{3});
  Tensor g = ToDevice(be, std::vector<float>{0.6f, 0.8f, 0.5f}, Shape{3});
  OptimizerConfig c;
  c.kind = OptimizerKind::kLars;
  c.momentum = 0;
  c.weight_decay = 0.1;
  c.lars_eta = 0.01;
  c.tensors = {{0, 2}, {2, 3}};
  c.no_decay = {{2, 3}};
  Optimizer opt(be, c, p);
  opt.Step(&p, g, 1.f, 1.f);
  const double trust = 0.01 * 5 / (1 + 0.5 + 1e-8);
  const std::vector<float> got = ToHost(be, p);
  EXPECT_NEAR(got[0], 3 - trust * (0.6 + 0.3), 1e-6);
  EXPECT_NEAR(got[1], 4 - trust * (0.8 + 0.4), 1e-6);
  EXPECT_NEAR(got[2], 2 - 0.5, 1e-6);
}

TEST(OptimizerTest, SgdNesterov) {
  Backend& be = GetBackend("cpu");
  Tensor p = ToDevice(be, std::vector<float>{1.f}, Shape{1});
  Tensor g = ToDevice(be, std::vector<float>{1.f}, Shape{1});
  OptimizerConfig c;
  c.momentum = 0.5;
  c.nesterov = true;
  Optimizer opt(be, c, p);
  // d = 1; buf = 1; d = 1 + 0.5*1 = 1.5; p = 1 - 0.1*1.5 = 0.85
  opt.Step(&p, g, 0.1f, 1.f);
  EXPECT_NEAR(ToHost(be, p)[0], 0.85f, 1e-6);
  // d = 1; buf = 0.5 + 1 = 1.5; d = 1 + 0.75 = 1.75; p = 0.85 - 0.175
  opt.Step(&p, g, 0.1f, 1.f);
  EXPECT_NEAR(ToHost(be, p)[0], 0.675f, 1e-6);
}

TEST(OptimizerTest, SgdWithoutMomentumHasNoState) {
  Backend& be = GetBackend("cpu");
  Tensor p = ToDevice(be, std::vector<float>{1.f}, Shape{1});
  Tensor g = ToDevice(be, std::vector<float>{2.f}, Shape{1});
  OptimizerConfig c;
  c.momentum = 0;
  Optimizer opt(be, c, p);
  EXPECT_TRUE(opt.slots().empty());
  opt.Step(&p, g, 0.25f, 1.f);
  EXPECT_NEAR(ToHost(be, p)[0], 0.5f, 1e-7);
}

TEST(OptimizerTest, AdamWMatchesHandComputed) {
  Backend& be = GetBackend("cpu");
  Tensor p = ToDevice(be, std::vector<float>{1.f}, Shape{1});
  Tensor g = ToDevice(be, std::vector<float>{0.5f}, Shape{1});
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdamW;
  c.weight_decay = 0.01;
  Optimizer opt(be, c, p);
  ASSERT_EQ(opt.slot_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  double pd = 1, m = 0, v = 0;
  for (int t = 1; t <= 3; ++t) {
    opt.Step(&p, g, 0.1f, 1.f);
    pd *= 1 - 0.1 * 0.01;
    m = 0.9 * m + 0.1 * 0.5;
    v = 0.999 * v + 0.001 * 0.25;
    const double mhat = m / (1 - std::pow(0.9, t)), vhat = v / (1 - std::pow(0.999, t));
    pd -= 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
    // f32 arithmetic: (1 - beta2) rounds to 0.00099998713f, 1.3e-5 relative.
    EXPECT_NEAR(ToHost(be, p)[0], pd, 1e-5) << "step " << t;
  }
  EXPECT_NEAR(ToHost(be, opt.slots()[0])[0], m, 1e-7);
  EXPECT_NEAR(ToHost(be, opt.slots()[1])[0], v, 2e-5 * v);
}

TEST(ScheduleTest, ConstantWithWarmup) {
  ScheduleConfig c;
  c.base_lr = 0.1;
  c.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(LearningRate(c, 0), 0.025);
  EXPECT_DOUBLE_EQ(LearningRate(c, 3), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(c, 4), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(c, 1000), 0.1);
}

TEST(ScheduleTest, StepDecaysAtBoundaries) {
  ScheduleConfig c;
  c.kind = ScheduleKind::kStep;
  c.base_lr = 1;
  c.step_size = 10;
  c.gamma = 0.5;
  EXPECT_DOUBLE_EQ(LearningRate(c, 0), 1);
  EXPECT_DOUBLE_EQ(LearningRate(c, 9), 1);
  EXPECT_DOUBLE_EQ(LearningRate(c, 10), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(c, 19), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(c, 20), 0.25);
  c.warmup_steps = 5;  // decay counts from the end of warm-up
  EXPECT_DOUBLE_EQ(LearningRate(c, 14), 1);
  EXPECT_DOUBLE_EQ(LearningRate(c, 15), 0.5);
}

TEST(ScheduleTest, CosineStartsAtBaseEndsAtZero) {
  ScheduleConfig c;
  c.kind = ScheduleKind::kCosine;
  c.base_lr = 0.2;
  c.total_steps = 100;
  EXPECT_DOUBLE_EQ(LearningRate(c, 0), 0.2);
  EXPECT_NEAR(LearningRate(c, 50), 0.1, 1e-12);
  EXPECT_NEAR(LearningRate(c, 100), 0.0, 1e-12);
  EXPECT_NEAR(LearningRate(c, 150), 0.0, 1e-12);
  c.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(LearningRate(c, 9), 0.2);
  EXPECT_DOUBLE_EQ(LearningRate(c, 10), 0.2);
  EXPECT_NEAR(LearningRate(c, 55), 0.1, 1e-12);
}

// torch.optim.lr_scheduler.MultiStepLR(milestones=[3, 5], gamma=0.1) stepped once per step:
// the lr of steps 0..7 (PyTorch 1.13).
TEST(ScheduleTest, MultiStepIsPyTorchs) {
  ScheduleConfig c;
  c.kind = ScheduleKind::kMultiStep;
  c.base_lr = 0.1;
  c.gamma = 0.1;
  c.milestones = {3, 5};
  const double torch_lr[] = {0.1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.001};
  for (int64_t s = 0; s < 8; ++s) EXPECT_NEAR(LearningRate(c, s), torch_lr[s], 1e-15) << s;
  c.warmup_steps = 2;  // milestones count from the end of warm-up, as torchvision chains them
  EXPECT_DOUBLE_EQ(LearningRate(c, 0), 0.05);
  EXPECT_NEAR(LearningRate(c, 4), 0.1, 1e-15);
  EXPECT_NEAR(LearningRate(c, 5), 0.01, 1e-15);
}

// torch.optim.lr_scheduler.OneCycleLR(max_lr=0.1, total_steps=20) with its defaults: the lr of
// steps 0..19 (PyTorch 1.13, printed with 17 digits).
TEST(ScheduleTest, OneCycleIsPyTorchs) {
  ScheduleConfig c;
  c.kind = ScheduleKind::kOneCycle;
  c.base_lr = 0.1;
  c.total_steps = 20;
  const double torch_lr[] = {
      0.0040000000000000036, 0.013167184270002533,  0.037167184270002526,  0.066832815729997469,
      0.090832815729997476,  0.10000000000000001,   0.098746400623508743,  0.095048463201347383,
      0.089091617757105002,  0.081174565394976306,  0.071694300179130088,  0.06112620219362893,
      0.050000200000000002,  0.038874197806371073,  0.028306099820869922,  0.018825834605023701,
      0.010908782242895003,  0.0049519367986526289, 0.0012539993764912555, 3.9999999999999998e-07};
  for (int64_t s = 0; s < 20; ++s) EXPECT_NEAR(LearningRate(c, s), torch_lr[s], 1e-15) << s;
}

}  // namespace
}  // namespace dptrain
