// SPDX-License-Identifier: Apache-2.0
// Prepare* caches plans: an identical descriptor (even a separately built copy) returns the very
// same plan object, a different descriptor a different one (STYLE.md section 2: plan once, run
// many).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/testing/backends.h"

namespace dptrain::testing {
namespace {

Conv2dDesc SomeConv() {
  Conv2dDesc d;
  d.n = 2, d.c = 3, d.h = 7, d.w = 5, d.k = 6, d.r = 3, d.s = 3, d.stride = 1, d.pad = 1;
  return d;
}

LinearDesc SomeLinear() {
  LinearDesc d;
  d.n = 5, d.in = 13, d.out = 7;
  return d;
}

PoolDesc SomePool() {
  PoolDesc d;
  d.n = 2, d.c = 3, d.h = 7, d.w = 5, d.kernel = 3, d.stride = 2, d.pad = 1;
  return d;
}

class PlanCacheTest : public BackendTest {};

TEST_P(PlanCacheTest, Conv2d) {
  Backend& be = backend();
  const Conv2dDesc a = SomeConv();
  DPT_SKIP_UNLESS_SUPPORTED(be, a);
  const std::shared_ptr<OpPlan> p1 = be.PrepareConv2d(a);
  const std::shared_ptr<OpPlan> p2 = be.PrepareConv2d(SomeConv());
  ASSERT_NE(p1, nullptr);
  EXPECT_EQ(p1.get(), p2.get()) << "identical descriptor, different plan";

  for (auto change :
       {+[](Conv2dDesc& d) { d.n = 3; }, +[](Conv2dDesc& d) { d.stride = 2; },
        +[](Conv2dDesc& d) { d.pad = 0; }, +[](Conv2dDesc& d) { d.bias = false; },
        +[](Conv2dDesc& d) { d.s = 1; }, +[](Conv2dDesc& d) { d.k = 9; },
        +[](Conv2dDesc& d) { d.groups = 3; }, +[](Conv2dDesc& d) { d.dilation = 2; }}) {
    Conv2dDesc b = SomeConv();
    change(b);
    SCOPED_TRACE(b.ToString());
    if (!be.Supports(b)) continue;
    EXPECT_NE(be.PrepareConv2d(b).get(), p1.get()) << "different descriptor, same plan";
  }
  Conv2dDesc bf = SomeConv();
  bf.precision = Precision::kBF16;
  if (be.Supports(bf)) {
    EXPECT_NE(be.PrepareConv2d(bf).get(), p1.get()) << "bf16 shares the f32 plan";
  }
}

TEST_P(PlanCacheTest, Linear) {
  Backend& be = backend();
  const LinearDesc a = SomeLinear();
  DPT_SKIP_UNLESS_SUPPORTED(be, a);
  const std::shared_ptr<OpPlan> p1 = be.PrepareLinear(a);
  ASSERT_NE(p1, nullptr);
  EXPECT_EQ(p1.get(), be.PrepareLinear(SomeLinear()).get()) << "identical descriptor";
  for (auto change : {+[](LinearDesc& d) { d.n = 6; }, +[](LinearDesc& d) { d.in = 1; },
                      +[](LinearDesc& d) { d.out = 8; }, +[](LinearDesc& d) { d.bias = false; }}) {
    LinearDesc b = SomeLinear();
    change(b);
    SCOPED_TRACE(b.ToString());
    if (!be.Supports(b)) continue;
    EXPECT_NE(be.PrepareLinear(b).get(), p1.get()) << "different descriptor, same plan";
  }
}

TEST_P(PlanCacheTest, Pool) {
  Backend& be = backend();
  const PoolDesc a = SomePool();
  DPT_SKIP_UNLESS_SUPPORTED(be, a);
  const std::shared_ptr<OpPlan> p1 = be.PreparePool(a);
  ASSERT_NE(p1, nullptr);
  EXPECT_EQ(p1.get(), be.PreparePool(SomePool()).get()) << "identical descriptor";
  for (auto change : {+[](PoolDesc& d) { d.kind = PoolKind::kAvg; }, +[](PoolDesc& d) { d.h = 9; },
                      +[](PoolDesc& d) { d.kernel = 2; }, +[](PoolDesc& d) { d.pad = 0; }}) {
    PoolDesc b = SomePool();
    change(b);
    SCOPED_TRACE(b.ToString());
    if (!be.Supports(b)) continue;
    EXPECT_NE(be.PreparePool(b).get(), p1.get()) << "different descriptor, same plan";
  }
}

// Two holders `a` and `b` of one conv2d plan: a's backward after b's forward (of another input)
// gives the gradients a's backward gives right after its own forward.
void ExpectOwnGradients(Backend& be, const Conv2dDesc& d, const OpPlan& a, const OpPlan& b) {
  const Shape xs{d.n, d.c, d.h, d.w}, ws{d.k, d.c, d.r, d.s}, ys{d.n, d.k, d.out_h(), d.out_w()};
  Tensor xa = ToDevice(be, RandomUniform(xs.numel(), 1), xs);
  Tensor xb = ToDevice(be, RandomUniform(xs.numel(), 2), xs);
  Tensor w = ToDevice(be, RandomUniform(ws.numel(), 3), ws),
         bias = be.Zeros({d.k}, DType::kF32, "b");
  Tensor dy = ToDevice(be, RandomUniform(ys.numel(), 4), ys);
  Tensor y = be.Empty(ys, DType::kF32, "y"), dx = be.Empty(xs, DType::kF32, "dx");
  Tensor dw = be.Empty(ws, DType::kF32, "dw"), db = be.Empty({d.k}, DType::kF32, "db");
  const auto grads = [&](bool other_between) {
    be.Conv2dForward(a, xa, w, &bias, &y);
    if (other_between) be.Conv2dForward(b, xb, w, &bias, &y);
    be.Conv2dBackward(a, xa, dy, w, &dx, &dw, &db, false);
    return std::vector<std::vector<float>>{ToHost(be, dx), ToHost(be, dw), ToHost(be, db)};
  };
  EXPECT_EQ(grads(true), grads(false));
}

// A plan two layers share (two same-shaped convolutions) stages x once per layer that holds it:
// the first layer's backward finds its own input staged by its forward, not the second layer's
// (the CPU backend's bf16 staging; one copy more per holder, none for a holder preparing again),
// and the gradients are those of the layer alone.
TEST_P(PlanCacheTest, ASharedPlanStagesEachHoldersInput) {
  Backend& be = backend();
  Conv2dDesc d = SomeConv();
  d.n = 3, d.c = 5, d.k = 4, d.precision = Precision::kBF16;
  d.x_nhwc = d.y_nhwc = true;
  if (be.device() != Device::kCpu || !be.Supports(d)) {
    GTEST_SKIP() << be.name() << ": no bf16 channels-last convolution staged on the host";
  }
  be.ReleasePlans();
  const std::shared_ptr<OpPlan> a = be.PrepareConv2d(d);
  const size_t one = a->held_bytes;
  std::shared_ptr<OpPlan> b = be.PrepareConv2d(d);
  ASSERT_EQ(a.get(), b.get());
  const size_t x_bf16 = static_cast<size_t>(d.n * d.c * d.h * d.w) * 2;
  EXPECT_EQ(a->held_bytes, one + x_bf16) << "a staged input per holder";
  b.reset();
  b = be.PrepareConv2d(d);
  EXPECT_EQ(a->held_bytes, one + x_bf16) << "the same two holders";
  be.SetCpuFusions(false);  // planning for CUDA (dptrain plan): one staged input per plan there
  std::shared_ptr<OpPlan> c = be.PrepareConv2d(d);
  be.SetCpuFusions(true);
  EXPECT_EQ(a->held_bytes, one + x_bf16) << "a third holder while planning for CUDA";
  c.reset();

  ExpectOwnGradients(be, d, *a, *b);
}

// The same for a plan whose three passes are GEMMs over its input unfolded (the CPU backend's
// bf16 channels-last convolutions with at most 16 output pixels, ConvPlan::gemm): one buffer of
// columns per plan, so the backward unfolds its own input again when another layer's forward
// unfolded the other's since, and reuses the forward's columns when not.
TEST_P(PlanCacheTest, ASharedGemmPlanUnfoldsEachHoldersInput) {
  Backend& be = backend();
  Conv2dDesc d = SomeConv();
  d.n = 3, d.c = 5, d.h = 4, d.w = 3, d.k = 4, d.precision = Precision::kBF16;
  d.x_nhwc = d.y_nhwc = true;
  if (be.device() != Device::kCpu || !be.Supports(d)) {
    GTEST_SKIP() << be.name() << ": no bf16 channels-last convolution as GEMMs on the host";
  }
  be.ReleasePlans();
  const std::shared_ptr<OpPlan> a = be.PrepareConv2d(d), b = be.PrepareConv2d(d);
  ASSERT_EQ(a.get(), b.get());
  ASSERT_TRUE(cpu::CpuBackend::PlannedGemm(*a)) << d.ToString();
  ExpectOwnGradients(be, d, *a, *b);
}

// What a CPU convolution writes and reads within one pass only (a strided convolution's unfolded
// input in its weight gradient, the GEMM plans' input-gradient columns, the subsampled plans'
// strided dx) lives in one buffer all plans share: another plan's whole step between a plan's
// forward and backward leaves that backward's gradients as they are without it.
TEST_P(PlanCacheTest, PlansShareTheirOnePassBuffers) {
  Backend& be = backend();
  Conv2dDesc strided = SomeConv();  // unfolded weight gradient (64 x 288 weights), not a GEMM plan
  strided.n = 2, strided.c = 32, strided.h = strided.w = 12, strided.k = 64, strided.stride = 2;
  Conv2dDesc gemm = SomeConv();  // at most 16 output pixels: all three passes GEMMs
  gemm.n = 3, gemm.c = 5, gemm.h = 4, gemm.w = 3, gemm.k = 4;
  Conv2dDesc sub = SomeConv();  // 1x1 stride 2: run on the pixels it reads
  sub.n = 2, sub.c = 16, sub.h = sub.w = 12, sub.k = 24, sub.r = sub.s = 1, sub.stride = 2;
  sub.pad = 0;
  std::vector<Conv2dDesc> descs{strided, gemm, sub};
  for (Conv2dDesc& d : descs) {
    d.precision = Precision::kBF16;
    d.x_nhwc = d.y_nhwc = true;
    if (be.device() != Device::kCpu || !be.Supports(d)) {
      GTEST_SKIP() << be.name() << ": no bf16 channels-last convolution on the host";
    }
  }
  ASSERT_TRUE(cpu::CpuBackend::UnfoldsWeightGradient(descs[0]));
  be.ReleasePlans();
  std::vector<std::shared_ptr<OpPlan>> plans(descs.size());
  for (size_t j = 0; j < descs.size(); ++j) plans[j] = be.PrepareConv2d(descs[j]);
  ASSERT_FALSE(cpu::CpuBackend::PlannedGemm(*plans[0]));
  ASSERT_TRUE(cpu::CpuBackend::PlannedGemm(*plans[1]));
  ASSERT_TRUE(cpu::CpuBackend::PlannedSubsample(*plans[2]));
  // Each plan's operands (fixed random values) and results.
  struct Operands {
    Tensor x, w, dy, bias, y, dx, dw, db;
  };
  std::vector<Operands> ops;
  ops.reserve(descs.size());
  for (size_t j = 0; j < descs.size(); ++j) {
    const Conv2dDesc& d = descs[j];
    const Shape xs{d.n, d.c, d.h, d.w}, ws{d.k, d.c, d.r, d.s}, ys{d.n, d.k, d.out_h(), d.out_w()};
    const auto seed = static_cast<uint32_t>(10 * j);
    ops.push_back({ToDevice(be, RandomUniform(xs.numel(), seed + 1), xs),
                   ToDevice(be, RandomUniform(ws.numel(), seed + 2), ws),
                   ToDevice(be, RandomUniform(ys.numel(), seed + 3), ys),
                   be.Zeros({d.k}, DType::kF32, "b"), be.Empty(ys, DType::kF32, "y"),
                   be.Empty(xs, DType::kF32, "dx"), be.Empty(ws, DType::kF32, "dw"),
                   be.Empty({d.k}, DType::kF32, "db")});
  }
  const auto forward = [&](size_t j) {
    Operands& o = ops[j];
    be.Conv2dForward(*plans[j], o.x, o.w, &o.bias, &o.y);
  };
  const auto backward = [&](size_t j) {
    Operands& o = ops[j];
    be.Conv2dBackward(*plans[j], o.x, o.dy, o.w, &o.dx, &o.dw, &o.db, false);
  };
  // plan i's forward, then (with `between`) every other plan's forward and backward, then plan
  // i's backward: plan i's output and gradients
  const auto step = [&](size_t i, bool between) {
    forward(i);
    for (size_t j = 0; between && j < descs.size(); ++j) {
      if (j == i) continue;
      forward(j);
      backward(j);
    }
    backward(i);
    const Operands& o = ops[i];
    return std::vector<std::vector<float>>{ToHost(be, o.y), ToHost(be, o.dx), ToHost(be, o.dw),
                                           ToHost(be, o.db)};
  };
  for (size_t i = 0; i < descs.size(); ++i) {
    SCOPED_TRACE(descs[i].ToString());
    EXPECT_EQ(step(i, true), step(i, false));
  }
}

// Supports answers honestly: empty or impossible shapes are refused (and Prepare* throws
// UnsupportedError for them rather than handing a broken plan to a layer).
TEST_P(PlanCacheTest, RefusesImpossibleShapes) {
  Backend& be = backend();
  Conv2dDesc conv = SomeConv();
  conv.h = 0;  // padding alone would give a non-empty output
  EXPECT_FALSE(be.Supports(conv)) << conv.ToString();
  EXPECT_THROW(be.PrepareConv2d(conv), UnsupportedError);
  Conv2dDesc grouped = SomeConv();
  grouped.groups = 2;  // does not divide the 3 input channels
  EXPECT_FALSE(be.Supports(grouped)) << grouped.ToString();
  EXPECT_THROW(be.PrepareConv2d(grouped), UnsupportedError);
  LinearDesc linear = SomeLinear();
  linear.in = 0;
  EXPECT_FALSE(be.Supports(linear)) << linear.ToString();
  EXPECT_THROW(be.PrepareLinear(linear), UnsupportedError);
  PoolDesc pool = SomePool();
  pool.pad = 2;  // more than half the 3-wide window
  EXPECT_FALSE(be.Supports(pool)) << pool.ToString();
  EXPECT_THROW(be.PreparePool(pool), UnsupportedError);
}

INSTANTIATE_TEST_SUITE_P(All, PlanCacheTest, ::testing::ValuesIn(TestBackends()), BackendParamName);

}  // namespace
}  // namespace dptrain::testing
