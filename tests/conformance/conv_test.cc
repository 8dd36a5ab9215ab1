// SPDX-License-Identifier: Apache-2.0
// Conv2d on every built backend against the double reference: forward, backward data, backward
// weights (overwrite and accumulate), on awkward shapes (batch 1, odd and non-square images, prime
// channel counts, padding 0/1/2, stride 1/2, kernels 1/3/5 and non-square, depthwise and grouped,
// dilated, channel counts in multiples of 8) and in bf16/f16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#include "core/elementwise.h"
#include "tests/testing/backends.h"
#include "tests/testing/reference_ops.h"
#include "tests/testing/tolerances.h"
#include "tests/testing/weighted_op_checks.h"

namespace dptrain::testing {
namespace {

Conv2dDesc MakeConv(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t s,
                    int64_t stride, int64_t pad, bool bias, Precision p = Precision::kF32) {
  Conv2dDesc d;
  d.n = n, d.c = c, d.h = h, d.w = w, d.k = k, d.r = r, d.s = s;
  d.stride = stride, d.pad = pad, d.bias = bias, d.precision = p;
  return d;
}
Conv2dDesc WithGroups(Conv2dDesc d, int64_t groups, int64_t dilation = 1) {
  d.groups = groups;
  d.dilation = dilation;
  return d;
}

// The shapes every conv test runs.
std::vector<Conv2dDesc> Cases(Precision p) {
  return {
      MakeConv(1, 1, 1, 1, 1, 1, 1, 1, 0, true, p),    // everything 1
      MakeConv(1, 3, 7, 5, 2, 3, 3, 1, 1, true, p),    // batch 1, odd non-square image
      MakeConv(2, 3, 7, 5, 5, 3, 3, 2, 1, false, p),   // stride 2, no bias
      MakeConv(3, 2, 9, 11, 7, 5, 5, 1, 2, true, p),   // kernel 5, pad 2
      MakeConv(2, 5, 8, 8, 3, 1, 1, 2, 0, true, p),    // 1x1 stride 2
      MakeConv(2, 4, 6, 6, 3, 3, 3, 2, 0, true, p),    // stride leaves the last row unused
      MakeConv(2, 3, 7, 9, 3, 3, 5, 1, 2, false, p),   // non-square kernel, pad > r/2
      MakeConv(1, 13, 5, 5, 17, 3, 3, 1, 1, true, p),  // prime channel counts
      MakeConv(4, 3, 16, 16, 8, 3, 3, 1, 1, true, p),  // larger: blocked / Winograd paths
      MakeConv(2, 3, 5, 5, 2, 5, 5, 1, 0, true, p),    // kernel = image: 1x1 output
      // channel counts in multiples of 8: CUDA stages 16-bit operands channels-last
      MakeConv(2, 8, 6, 5, 16, 3, 3, 1, 1, true, p),   // one partial tile along C and H*W
      MakeConv(3, 16, 7, 7, 8, 1, 1, 2, 0, false, p),  // 1x1 stride 2, no bias
      MakeConv(2, 40, 9, 7, 48, 3, 3, 1, 1, true, p),  // two tiles along C and H*W
      MakeConv(2, 24, 5, 6, 20, 1, 1, 1, 0, true, p),  // 1x1 stride 1 (a bottleneck's)
      // 1x1 strided, H and W multiples of the stride: the CPU's bf16 channels-last run them as
      // stride-1 convolutions of the pixels they read (CpuBackend::SubsamplesInput), one large
      // enough for the threaded loops
      MakeConv(4, 32, 16, 16, 48, 1, 1, 2, 0, false, p),    // a ResNet shortcut's
      MakeConv(2, 6, 18, 12, 5, 1, 1, 3, 0, true, p),       // stride 3
      MakeConv(2, 128, 12, 12, 256, 1, 1, 2, 0, false, p),  // a large one: its weight gradient
                                                            // unfolded too
      // first layers: 1-3 input channels into many
      MakeConv(3, 1, 10, 9, 32, 3, 3, 1, 1, true, p),    // ref_cnn's conv1, smaller
      MakeConv(2, 3, 11, 12, 16, 5, 5, 2, 2, false, p),  // RGB, stride 2, kernel 5
      MakeConv(2, 2, 9, 7, 16, 3, 2, 1, 0, true, p),     // non-square kernel, no padding
      MakeConv(1, 1, 9, 9, 16, 8, 8, 1, 3, true, p),     // kernel 8, pad 3
      // small outputs: the CPU's bf16 channels-last weight gradient as a GEMM over the input
      // unfolded (CpuBackend::UnfoldsWeightGradient)
      MakeConv(2, 32, 4, 4, 16, 3, 3, 1, 1, false, p),   // ResNet-18's last stage
      MakeConv(2, 32, 12, 12, 64, 3, 3, 2, 1, true, p),  // strided, 64 x 288 weights: unfolded
                                                         // too, or on tiles (below)
      // C and K multiples of 16: the CPU's bf16 channels-last weight gradient on AMX tiles
      // (CpuBackend::TilesWeightGradient): 3 taps at a time of one 16 x 16 block, or 2 x 2
      // blocks of one tap where C and K are multiples of 32
      MakeConv(2, 16, 9, 7, 16, 3, 3, 1, 1, false, p),  // odd width: a grid row of 9
      MakeConv(3, 32, 6, 5, 32, 3, 3, 1, 1, true, p),   // 2 x 2 blocks, with a bias
      MakeConv(2, 16, 8, 8, 48, 5, 5, 1, 2, true, p),   // 25 taps: a last group of one
      MakeConv(9, 32, 5, 6, 64, 1, 1, 1, 0, false, p),  // 1x1, more images than blocks
      MakeConv(2, 16, 7, 7, 32, 3, 3, 1, 0, false, p),  // no padding
      WithGroups(MakeConv(2, 3, 7, 7, 4, 3, 3, 2, 2, true, p), 1, 2),  // dilated, stride 2
      // depthwise (MobileNet): groups = C = K, stride 1 and 2, with and without bias
      WithGroups(MakeConv(2, 6, 7, 7, 6, 3, 3, 1, 1, false, p), 6),
      WithGroups(MakeConv(2, 5, 8, 6, 5, 3, 3, 2, 1, true, p), 5),
      WithGroups(MakeConv(1, 4, 6, 6, 8, 3, 3, 1, 1, true, p), 4),       // channel multiplier 2
      WithGroups(MakeConv(2, 6, 7, 5, 9, 3, 3, 1, 1, true, p), 3),       // 3 groups of 2 -> 3
      WithGroups(MakeConv(2, 4, 9, 9, 4, 3, 3, 1, 2, true, p), 1, 2),    // dilation 2
      WithGroups(MakeConv(1, 4, 11, 8, 6, 3, 3, 2, 3, false, p), 2, 3),  // grouped, dilated
  };
}

// Larger shapes for the CPU's weight gradient on AMX tiles, run by ChannelsLastMatchesReference
// only (the others' double references of them would take long; and oneDNN 2.6's bf16 NCHW
// forward with a folded ReLU at 160 x 128 read past a buffer under AddressSanitizer,
// Bf16XChangesNoBit).
std::vector<Conv2dDesc> TileCases(Precision p) {
  return {
      MakeConv(1, 64, 17, 17, 64, 3, 3, 1, 1, false, p),  // over 16 x 16 pixels, 64 x 64
      // C x K above 128 x 128: the weight split over the threads, a few images at a time
      MakeConv(3, 144, 5, 5, 128, 3, 3, 1, 1, true, p),    // 16 x 16 blocks, with a bias
      MakeConv(17, 128, 5, 5, 160, 3, 3, 1, 1, false, p),  // 2 x 2 blocks, 16 images and 1
      // stride 2 (the ones that run on AVX512-BF16 dot products without AMX): by images, and
      // with the weight split
      MakeConv(3, 32, 16, 16, 48, 3, 3, 2, 1, true, p),
      MakeConv(3, 144, 9, 9, 128, 3, 3, 2, 1, false, p),
  };
}

Shape XShape(const Conv2dDesc& d) { return {d.n, d.c, d.h, d.w}; }
Shape WShape(const Conv2dDesc& d) { return {d.k, d.group_c(), d.r, d.s}; }
Shape YShape(const Conv2dDesc& d) { return {d.n, d.k, d.out_h(), d.out_w()}; }

}  // namespace

// Conv2d plugged into the shared weighted-op checks (tests/testing/weighted_op_checks.h).
template <>
struct WeightedOp<Conv2dDesc> {
  using D = Conv2dDesc;
  static Shape X(const D& d) { return XShape(d); }
  static Shape W(const D& d) { return WShape(d); }
  static Shape Y(const D& d) { return YShape(d); }
  static int64_t Bias(const D& d) { return d.k; }
  static int64_t ForwardTerms(const D& d) { return d.group_c() * d.r * d.s + 1; }
  static int64_t DataTerms(const D& d) { return d.k / d.groups * d.r * d.s; }
  static int64_t WeightTerms(const D& d) { return d.n * d.out_h() * d.out_w(); }
  static std::shared_ptr<OpPlan> Prepare(Backend& be, const D& d) { return be.PrepareConv2d(d); }
  static void Forward(Backend& be, const OpPlan& p, const Tensor& x, const Tensor& w,
                      const Tensor* b, Tensor* y) {
    be.Conv2dForward(p, x, w, b, y);
  }
  static void BackwardData(Backend& be, const OpPlan& p, const Tensor& dy, const Tensor& w,
                           Tensor* dx) {
    be.Conv2dBackwardData(p, dy, w, dx);
  }
  static void BackwardWeights(Backend& be, const OpPlan& p, const Tensor& x, const Tensor& dy,
                              Tensor* dw, Tensor* db, bool accumulate) {
    be.Conv2dBackwardWeights(p, x, dy, dw, db, accumulate);
  }
  static void Backward(Backend& be, const OpPlan& p, const Tensor& x, const Tensor& dy,
                       const Tensor& w, Tensor* dx, Tensor* dw, Tensor* db, bool accumulate) {
    be.Conv2dBackward(p, x, dy, w, dx, dw, db, accumulate);
  }
  static void RefForward(const D& d, const std::vector<double>& x, const std::vector<double>& w,
                         const std::vector<double>* b, std::vector<double>* y) {
    ref::Conv2dForward(d, x, w, b, y);
  }
  static void RefBackwardData(const D& d, const std::vector<double>& dy,
                              const std::vector<double>& w, std::vector<double>* dx) {
    ref::Conv2dBackwardData(d, dy, w, dx);
  }
  static void RefBackwardWeights(const D& d, const std::vector<double>& x,
                                 const std::vector<double>& dy, std::vector<double>* dw,
                                 std::vector<double>* db, bool accumulate) {
    ref::Conv2dBackwardWeights(d, x, dy, dw, db, accumulate);
  }
};

namespace {

class ConvTest : public BackendTest {
 protected:
  template <class F>
  void ForEachCase(Precision p, F check) {
    ForEachSupportedCase(backend(), Cases(p), 1000, check);
  }
};

TEST_P(ConvTest, Forward) {
  ForEachCase(Precision::kF32,
              [&](const Conv2dDesc& d, uint32_t s) { CheckForward(backend(), d, s); });
}

TEST_P(ConvTest, BackwardData) {
  ForEachCase(Precision::kF32,
              [&](const Conv2dDesc& d, uint32_t s) { CheckBackwardData(backend(), d, s); });
}

TEST_P(ConvTest, BackwardWeights) {
  ForEachCase(Precision::kF32, [&](const Conv2dDesc& d, uint32_t s) {
    CheckBackwardWeights(backend(), d, s, /*accumulate=*/false);
  });
}

TEST_P(ConvTest, BackwardWeightsAccumulate) {
  ForEachCase(Precision::kF32, [&](const Conv2dDesc& d, uint32_t s) {
    CheckBackwardWeights(backend(), d, s, /*accumulate=*/true);
  });
}

// Running the same plan twice gives the same result (no state leaks between calls) and the
// second accumulate adds the same gradient again.
TEST_P(ConvTest, PlanReuseIsStateless) {
  Backend& be = backend();
  const Conv2dDesc d = MakeConv(2, 3, 7, 5, 4, 3, 3, 1, 1, true);
  DPT_SKIP_UNLESS_SUPPORTED(be, d);
  const WeightedData data = MakeWeightedData(d, 7);
  const std::vector<float> dy = RandomUniform(static_cast<size_t>(YShape(d).numel()), 8);
  auto plan = be.PrepareConv2d(d);
  Tensor x = ToDevice(be, data.x, XShape(d));
  Tensor w = ToDevice(be, data.w, WShape(d));
  Tensor b = ToDevice(be, data.b, {d.k});
  Tensor y1 = be.Empty(YShape(d), DType::kF32, "y1");
  Tensor y2 = be.Empty(YShape(d), DType::kF32, "y2");
  be.Conv2dForward(*plan, x, w, &b, &y1);
  be.Conv2dForward(*plan, x, w, &b, &y2);
  EXPECT_TRUE(AllClose(ToHost(be, y2), ToDouble(ToHost(be, y1)), kExactTol));

  Tensor dy_t = ToDevice(be, dy, YShape(d));
  Tensor dw = be.Zeros(WShape(d), DType::kF32, "dw");
  Tensor db = be.Zeros({d.k}, DType::kF32, "db");
  be.Conv2dBackwardWeights(*plan, x, dy_t, &dw, &db, /*accumulate=*/true);
  be.Conv2dBackwardWeights(*plan, x, dy_t, &dw, &db, /*accumulate=*/true);
  std::vector<double> ref_dw, ref_db;
  ref::Conv2dBackwardWeights(d, ToDouble(data.x), ToDouble(dy), &ref_dw, &ref_db, false);
  ref::Scale(&ref_dw, 2.0);
  ref::Scale(&ref_db, 2.0);
  const Tolerance tol = ForReduction(d.precision, 2 * d.n * d.out_h() * d.out_w());
  EXPECT_TRUE(AllClose(ToHost(be, dw), ref_dw, tol)) << "dw after two accumulations";
  EXPECT_TRUE(AllClose(ToHost(be, db), ref_db, tol)) << "db after two accumulations";
}

// A layer's input lives in the same buffer every step, refilled: each step's gradients are those
// of the values it holds then, not of the values an earlier step left staged or unfolded (the
// CPU backend's unfolded weight gradient reuses the forward's columns only when that forward
// unfolded them, ConvPlan::gemm), in bf16 channels-last: a small output (all three passes GEMMs
// with the fusions on, the weight gradient alone without) and a strided one with a large weight
// (its weight gradient alone). The steps catch a backward that reuses its own earlier unfolding
// (plans whose forward does not unfold); the backward alone at the end catches one that reuses
// another tensor's columns.
TEST_P(ConvTest, RefilledInputGivesItsOwnGradients) {
  Backend& be = backend();
  int ran = 0;
  for (Conv2dDesc d : {MakeConv(2, 32, 4, 4, 16, 3, 3, 1, 1, true, Precision::kBF16),
                       MakeConv(2, 32, 12, 12, 64, 3, 3, 2, 1, false, Precision::kBF16)}) {
    d.x_nhwc = d.y_nhwc = true;
    if (!be.Supports(d)) continue;
    for (const bool fusions : {true, false}) {
      SCOPED_TRACE(d.ToString() + (fusions ? ", fusions on" : ", fusions off"));
      ++ran;
      ScopedCpuFusions scoped(be, fusions);
      auto plan = be.PrepareConv2d(d);
      if (be.device() == Device::kCpu) {  // the paths this test is for
        ASSERT_TRUE(cpu::CpuBackend::UnfoldsWeightGradient(d));
        EXPECT_EQ(cpu::CpuBackend::PlannedGemm(*plan), fusions && d.out_h() * d.out_w() <= 16);
      }
      const Shape xs = XShape(d), ws = WShape(d), ys = YShape(d);
      Tensor w = ToDevice(be, RandomUniform(static_cast<size_t>(ws.numel()), 1), ws);
      Tensor b = ToDevice(be, RandomUniform(static_cast<size_t>(d.k), 2), {d.k});
      Tensor dy = ToDevice(be, RandomUniform(static_cast<size_t>(ys.numel()), 3), ys);
      Tensor x = be.Empty(xs, DType::kF32, "x"), y = be.Empty(ys, DType::kF32, "y");
      Tensor dx = be.Empty(xs, DType::kF32, "dx"), dw = be.Empty(ws, DType::kF32, "dw"),
             db = be.Empty({d.k}, DType::kF32, "db");
      const auto backward = [&](const Tensor& in) {
        be.Conv2dBackward(*plan, in, dy, w, &dx, &dw, d.bias ? &db : nullptr, false);
      };
      const auto pass = [&](const Tensor& in) {  // forward and backward: y, dx, dw
        be.Conv2dForward(*plan, in, w, d.bias ? &b : nullptr, &y);
        backward(in);
        return std::vector<std::vector<float>>{ToHost(be, y), ToHost(be, dx), ToHost(be, dw)};
      };
      const auto values = [&](uint32_t seed) {
        return RandomUniform(static_cast<size_t>(xs.numel()), seed);
      };
      const auto step = [&](uint32_t seed) {
        be.CopyFromHost(values(seed).data(), &x);
        return pass(x);
      };
      const auto first = step(10), second = step(11);
      Tensor fresh = ToDevice(be, values(11), xs);
      EXPECT_EQ(second, pass(fresh));
      EXPECT_NE(first[2], second[2]) << "the weight gradient did not follow the input";
      // a backward alone, its input refilled since the plan's last forward and backward (which
      // read another tensor, with other values), reads the refilled values
      const std::vector<float> v = values(12);
      const std::vector<float> expected = pass(ToDevice(be, v, xs))[2];
      pass(fresh);
      be.CopyFromHost(v.data(), &x);
      backward(x);
      EXPECT_EQ(ToHost(be, dw), expected) << "weight gradient after a refill without a forward";
    }
  }
  if (ran == 0) GTEST_SKIP() << be.name() << ": no bf16 channels-last convolution here";
}

// A layer keeps its plan when the backend's cache is released to make room (an evaluation that
// ran out of memory): the plan must still run, and give the same results, after ReleasePlans.
TEST_P(ConvTest, HeldPlanRunsAfterReleasePlans) {
  Backend& be = backend();
  // ref_cnn's conv1 at batch 8: its oneDNN primitives use a scratchpad here
  const Conv2dDesc d = MakeConv(8, 1, 28, 28, 32, 3, 3, 1, 1, true);
  DPT_SKIP_UNLESS_SUPPORTED(be, d);
  const WeightedData data = MakeWeightedData(d, 17);
  const std::vector<float> dy = RandomUniform(static_cast<size_t>(YShape(d).numel()), 18);
  auto plan = be.PrepareConv2d(d);
  Tensor x = ToDevice(be, data.x, XShape(d)), w = ToDevice(be, data.w, WShape(d));
  Tensor b = ToDevice(be, data.b, {d.k}), dy_t = ToDevice(be, dy, YShape(d));
  const auto run = [&] {
    Tensor y = be.Empty(YShape(d), DType::kF32, "y"), dx = be.Empty(XShape(d), DType::kF32, "dx");
    Tensor dw = be.Empty(WShape(d), DType::kF32, "dw"), db = be.Empty({d.k}, DType::kF32, "db");
    be.Conv2dForward(*plan, x, w, &b, &y);
    be.Conv2dBackward(*plan, x, dy_t, w, &dx, &dw, &db, false);
    return std::vector<std::vector<float>>{ToHost(be, y), ToHost(be, dx), ToHost(be, dw),
                                           ToHost(be, db)};
  };
  const auto before = run();
  be.ReleasePlans();
  be.allocator().EmptyCache();
  EXPECT_EQ(run(), before);
}

// Conv2dBackward against the two separate calls, in every precision.
TEST_P(ConvTest, BothBackwardPassesInOneCall) {
  for (const Precision prec : {Precision::kF32, Precision::kBF16, Precision::kF16}) {
    ForEachCase(prec,
                [&](const Conv2dDesc& d, uint32_t s) { CheckBothBackwardPasses(backend(), d, s); });
  }
}

TEST_P(ConvTest, BF16Forward) {
  ForEachCase(Precision::kBF16,
              [&](const Conv2dDesc& d, uint32_t s) { CheckForward(backend(), d, s); });
}

TEST_P(ConvTest, BF16BackwardData) {
  ForEachCase(Precision::kBF16,
              [&](const Conv2dDesc& d, uint32_t s) { CheckBackwardData(backend(), d, s); });
}

TEST_P(ConvTest, BF16BackwardWeights) {
  ForEachCase(Precision::kBF16, [&](const Conv2dDesc& d, uint32_t s) {
    CheckBackwardWeights(backend(), d, s, /*accumulate=*/true);
  });
}

TEST_P(ConvTest, F16Forward) {
  ForEachCase(Precision::kF16,
              [&](const Conv2dDesc& d, uint32_t s) { CheckForward(backend(), d, s); });
}

TEST_P(ConvTest, F16BackwardData) {
  ForEachCase(Precision::kF16,
              [&](const Conv2dDesc& d, uint32_t s) { CheckBackwardData(backend(), d, s); });
}

TEST_P(ConvTest, F16BackwardWeights) {
  ForEachCase(Precision::kF16, [&](const Conv2dDesc& d, uint32_t s) {
    CheckBackwardWeights(backend(), d, s, /*accumulate=*/true);
  });
}

// A ReLU folded into the convolution (Conv2dDesc::relu, what the graph does for a ReLU that alone
// reads a convolution): the forward against the reference's max(conv + bias, 0) in every
// precision, and against the same plan without the fold followed by ReluForward (the CPU
// backend's post-op gives the same bits; the CUDA backend's cuDNN fused call may round alike
// only to the forward's tolerance).
TEST_P(ConvTest, ForwardWithFoldedRelu) {
  Backend& be = backend();
  for (const Precision prec : {Precision::kF32, Precision::kBF16, Precision::kF16}) {
    std::vector<Conv2dDesc> cases = Cases(prec);
    for (Conv2dDesc& d : cases) d.relu = true;
    ForEachSupportedCase(be, cases, 1700, [&](const Conv2dDesc& d, uint32_t seed) {
      CheckForward(be, d, seed);
      Conv2dDesc plain = d;
      plain.relu = false;
      const WeightedData data = MakeWeightedData(d, seed);
      Tensor x = ToDevice(be, data.x, XShape(d)), w = ToDevice(be, data.w, WShape(d));
      Tensor b = ToDevice(be, data.b, {d.k});
      Tensor folded = be.Empty(YShape(d), DType::kF32, "folded");
      Tensor conv = be.Empty(YShape(d), DType::kF32, "conv");
      Tensor relu = be.Empty(YShape(d), DType::kF32, "conv then relu");
      be.Conv2dForward(*be.PrepareConv2d(d), x, w, d.bias ? &b : nullptr, &folded);
      be.Conv2dForward(*be.PrepareConv2d(plain), x, w, d.bias ? &b : nullptr, &conv);
      be.ReluForward(conv, &relu);
      const std::vector<float> got = ToHost(be, folded), want = ToHost(be, relu);
      if (be.name() == "cpu") {
        EXPECT_EQ(got, want) << "the post-op rounds as the ReLU after the convolution";
      } else {
        const Tolerance tol = ForReduction(d.precision, WeightedOp<Conv2dDesc>::ForwardTerms(d));
        EXPECT_TRUE(AllClose(got, ToDouble(want), tol));
      }
    });
  }
}

// fp16 semantics every backend shares (cuDNN half on CUDA, rounded f32 on CPU): outputs hold
// fp16 values only, and a gradient beyond the fp16 range (65504) becomes infinity, the overflow
// (or NaN, where infinities of both signs meet) that dynamic loss scaling detects and skips.
TEST_P(ConvTest, F16ResultsAreHalfValuesAndOverflowToInfinity) {
  Backend& be = backend();
  const Conv2dDesc d = MakeConv(2, 3, 6, 6, 4, 3, 3, 1, 1, false, Precision::kF16);
  DPT_SKIP_UNLESS_SUPPORTED(be, d);
  const WeightedData data = MakeWeightedData(d, 31);
  auto plan = be.PrepareConv2d(d);
  Tensor x = ToDevice(be, data.x, XShape(d));
  Tensor w = ToDevice(be, data.w, WShape(d));
  Tensor y = be.Empty(YShape(d), DType::kF32, "y");
  be.Conv2dForward(*plan, x, w, nullptr, &y);
  for (float v : ToHost(be, y)) ASSERT_EQ(v, ew::RoundToHalf(v)) << "not an fp16 value";

  for (float scale : {1.f, 1e5f}) {  // 1e5: every |dy| element beyond 65504 unless tiny
    std::vector<float> dy = RandomUniform(static_cast<size_t>(YShape(d).numel()), 32);
    for (float& v : dy) v = v * scale + (v >= 0 ? scale : -scale);  // |dy| >= scale
    Tensor dy_t = ToDevice(be, dy, YShape(d));
    Tensor dx = be.Empty(XShape(d), DType::kF32, "dx");
    be.Conv2dBackwardData(*plan, dy_t, w, &dx);
    int64_t bad = 0;  // infinite dy of both signs meet in sums: Inf or NaN
    for (float v : ToHost(be, dx)) bad += std::isfinite(v) ? 0 : 1;
    if (scale == 1.f) {
      EXPECT_EQ(bad, 0) << "dx overflowed with |dy| ~ 1";
    } else {
      EXPECT_GT(bad, 0) << "dy of 1e5 is infinite in fp16, so dx cannot be finite";
    }
  }
}

// Channels-last activations (Conv2dDesc::x_nhwc / y_nhwc, on backends that prefer them): x and
// dx, or y and dy, or all four in NHWC order, against the NCHW reference; fp32 and bf16, every
// shape above, the last combination with the folded ReLU.
TEST_P(ConvTest, ChannelsLastMatchesReference) {
  Backend& be = backend();
  if (!be.PrefersChannelsLast()) GTEST_SKIP() << be.name() << ": activations are NCHW only";
  uint32_t seed = 7000;
  int unfolded = 0, bf16_cases = 0, flipped = 0, subsampled = 0, gemm = 0, phased = 0;
  int tiled = 0, tileable = 0, blocked = 0;
  for (const Precision p : {Precision::kF32, Precision::kBF16}) {
    std::vector<Conv2dDesc> cases = Cases(p);
    for (const Conv2dDesc& d : TileCases(p)) cases.push_back(d);
    // ref_cnn's conv2 (32 -> 64 channels, 14 wide): the CPU's fp32 channels-last weight gradient
    // on x and dy staged into oneDNN's blocked layout (CpuBackend::BlocksWeightGradient)
    if (p == Precision::kF32) cases.push_back(MakeConv(2, 32, 14, 14, 64, 3, 3, 1, 1, true, p));
    for (Conv2dDesc d : cases) {
      if (!be.Supports(d)) continue;            // bf16 without oneDNN's bf16 kernels
      for (const int layouts : {1, 2, 3, 7}) {  // 7: both channels-last, no ReLU
        d.x_nhwc = (layouts & 1) != 0;
        d.y_nhwc = (layouts & 2) != 0;
        d.relu = layouts == 3;
        bf16_cases += p == Precision::kBF16 ? 1 : 0;
        unfolded += be.device() == Device::kCpu && cpu::CpuBackend::UnfoldsWeightGradient(d);
        SCOPED_TRACE(d.ToString());
        seed += 10;
        const std::vector<float> x = RandomUniform(static_cast<size_t>(XShape(d).numel()), seed),
                                 w = RandomUniform(static_cast<size_t>(WShape(d).numel()),
                                                   seed + 1),
                                 b = RandomUniform(static_cast<size_t>(d.k), seed + 2),
                                 dy = RandomUniform(static_cast<size_t>(YShape(d).numel()),
                                                    seed + 3);
        auto plan = be.PrepareConv2d(d);
        subsampled += be.device() == Device::kCpu && cpu::CpuBackend::PlannedSubsample(*plan);
        tiled += be.device() == Device::kCpu && cpu::CpuBackend::PlannedTiles(*plan);
        blocked +=
            be.device() == Device::kCpu && cpu::CpuBackend::PlannedBlockedWeightGradient(*plan);
        tileable += be.device() == Device::kCpu && cpu::CpuBackend::TilesWeightGradient(d);
        const bool as_gemm = be.device() == Device::kCpu && cpu::CpuBackend::PlannedGemm(*plan);
        gemm += as_gemm;
        Tensor x_t = InLayout(be, x, XShape(d), d.x_nhwc),
               dy_t = InLayout(be, dy, YShape(d), d.y_nhwc);
        Tensor w_t = ToDevice(be, w, WShape(d)), b_t = ToDevice(be, b, Shape{d.k});
        Tensor y = be.Empty(YShape(d), DType::kF32, "y");
        be.Conv2dForward(*plan, x_t, w_t, d.bias ? &b_t : nullptr, &y);
        std::vector<double> ref_b = ToDouble(b), ref_y, ref_dx, ref_dw, ref_db;
        ref::Conv2dForward(d, ToDouble(x), ToDouble(w), d.bias ? &ref_b : nullptr, &ref_y);
        if (d.relu) {
          for (double& v : ref_y) v = std::max(v, 0.0);
        }
        EXPECT_TRUE(AllClose(ToHostNchw(be, y, d.y_nhwc), ref_y,
                             ForReduction(p, d.group_c() * d.r * d.s + 1)))
            << "forward";
        Tensor dx = be.Empty(XShape(d), DType::kF32, "dx");
        Tensor dw = be.Empty(WShape(d), DType::kF32, "dw"), db = be.Empty({d.k}, DType::kF32, "db");
        be.Conv2dBackward(*plan, x_t, dy_t, w_t, &dx, &dw, d.bias ? &db : nullptr, false);
        ref::Conv2dBackwardData(d, ToDouble(dy), ToDouble(w), &ref_dx);
        ref::Conv2dBackwardWeights(d, ToDouble(x), ToDouble(dy), &ref_dw,
                                   d.bias ? &ref_db : nullptr, false);
        EXPECT_TRUE(AllClose(ToHostNchw(be, dx, d.x_nhwc), ref_dx,
                             ForReduction(p, d.k / d.groups * d.r * d.s)))
            << "backward data";
        const bool flip = be.device() == Device::kCpu && cpu::CpuBackend::PlannedFlip(*plan);
        const bool phases = be.device() == Device::kCpu && cpu::CpuBackend::PlannedPhases(*plan);
        if (flip || as_gemm || phases) {
          // the input gradient as a forward convolution with the flipped kernel, or as a GEMM
          // and its columns summed back, or by phases, also alone
          flipped += flip;
          phased += phases;
          Tensor dx_alone = be.Empty(XShape(d), DType::kF32, "dx alone");
          be.Conv2dBackwardData(*plan, dy_t, w_t, &dx_alone);
          EXPECT_TRUE(AllClose(ToHostNchw(be, dx_alone, d.x_nhwc), ref_dx,
                               ForReduction(p, d.k * d.r * d.s)))
              << "backward data alone";
          // new weights (twice the old: exact in bf16 too) are flipped again, not the old reused
          std::vector<float> w2 = w;
          for (float& v : w2) v *= 2.f;
          be.Conv2dBackwardData(*plan, dy_t, ToDevice(be, w2, WShape(d)), &dx_alone);
          std::vector<double> ref_dx2 = ref_dx;
          for (double& v : ref_dx2) v *= 2.0;
          EXPECT_TRUE(AllClose(ToHostNchw(be, dx_alone, d.x_nhwc), ref_dx2,
                               ForReduction(p, d.k * d.r * d.s)))
              << "backward data alone, new weights";
        }
        const Tolerance wt = ForReduction(p, d.n * d.out_h() * d.out_w());
        EXPECT_TRUE(AllClose(ToHost(be, dw), ref_dw, wt)) << "backward weights";
        if (d.bias) {
          EXPECT_TRUE(AllClose(ToHost(be, db), ref_db, wt)) << "backward bias";
        }
        // accumulate = true adds this gradient to the last: twice the reference
        be.Conv2dBackwardWeights(*plan, x_t, dy_t, &dw, d.bias ? &db : nullptr, true);
        for (double& v : ref_dw) v *= 2;
        for (double& v : ref_db) v *= 2;
        EXPECT_TRUE(AllClose(ToHost(be, dw), ref_dw, wt)) << "backward weights, accumulated";
        if (d.bias) {
          EXPECT_TRUE(AllClose(ToHost(be, db), ref_db, wt)) << "backward bias, accumulated";
        }
      }
    }
  }
  // The unfolded weight gradient ran on the small outputs above (with and without bias, strided,
  // dilated, padded, 1x1), wherever bf16 did.
  // So did the flipped input gradient on some of the stride-1 ungrouped shapes (CpuBackend::
  // FlipsBackwardData): on CPUs with bf16 kernels (AVX-512) oneDNN has brgemm forward kernels
  // for fp32 at least (24 cases flip on an AMX Xeon, fp32 and bf16).
  // All three passes of those ran as GEMMs where x and y were both channels-last (the CPU
  // fusions are on here). And the larger strided 1x1 ones ran as stride-1 convolutions of the
  // pixels they read (three shapes, with and without the folded ReLU) in bf16, and the two
  // strided 3x3 of 32 channels on even images their input gradient by phases
  // (CpuBackend::PhasesBackwardData; with and without the ReLU), where oneDNN has brgemm kernels
  // for them (AVX-512).
  // The blocked weight gradient: that shape with both sides channels-last (with and without the
  // ReLU), and no other.
  if (be.device() == Device::kCpu) {
    EXPECT_EQ(blocked, 2);
  }
  if (be.device() == Device::kCpu && bf16_cases > 0) {
    EXPECT_GE(unfolded, 6);
    EXPECT_GE(gemm, 6);
    EXPECT_GT(flipped, 0);
    EXPECT_EQ(subsampled, 6);
    EXPECT_EQ(phased, 4);
    // the five shapes in Cases, the five of TileCases and the strided 64 x 288 one with both
    // sides channels-last, with and without the ReLU, and the first layers' (1-3 and 8 channels
    // into 16 or 32) with a planar x, where the CPU has AMX; without it, on AVX512-BF16 dot
    // products, the same with a channels-last x but for the weight split, all by image pairs:
    // the two strided ones, the five of Cases and the 64 x 64 one at stride 1 (else none)
    EXPECT_EQ(tiled, tileable);
    if (tileable == 0) {
      std::cout << "[ INFO ] no AMX tiles or AVX512-BF16 on this CPU: oneDNN's weight gradient\n";
    } else {
      EXPECT_EQ(tiled, cpu::CpuBackend::TilesByDotProducts() ? 16 : 26);
    }
  }
}

// Conv2dDesc::dy_bf16 (bf16, where the backend runs it): dy handed over in bf16 gives bit for bit
// what the same values in f32 give (the backward rounds an f32 dy to bf16 itself), for both
// passes in one call and each alone, accumulating, NCHW and channels-last.
TEST_P(ConvTest, Bf16DyChangesNoBit) {
  Backend& be = backend();
  int ran = 0;
  uint32_t seed = 9000;
  for (Conv2dDesc d : Cases(Precision::kBF16)) {
    for (const bool nhwc : {false, true}) {
      d.x_nhwc = d.y_nhwc = nhwc;
      d.dy_bf16 = true;
      seed += 10;
      if (!be.Supports(d)) continue;
      SCOPED_TRACE(d.ToString());
      ++ran;
      Conv2dDesc f32 = d;
      f32.dy_bf16 = false;
      const auto order = [&](const std::vector<float>& v, const Shape& shape) {
        return nhwc ? ToNhwc(v, shape) : v;
      };
      const std::vector<float> x = order(RandomUniform(XShape(d).numel(), seed), XShape(d)),
                               w = RandomUniform(WShape(d).numel(), seed + 1),
                               dy = order(RandomUniform(YShape(d).numel(), seed + 2), YShape(d));
      Tensor x_t = ToDevice(be, x, XShape(d)), w_t = ToDevice(be, w, WShape(d));
      Tensor dy_t = ToDevice(be, dy, YShape(d)), dy16_t = ToDeviceBf16(be, dy, YShape(d));
      std::vector<std::vector<float>> got[2];
      for (const int k : {0, 1}) {
        const auto plan = be.PrepareConv2d(k == 0 ? f32 : d);
        const Tensor& g = k == 0 ? dy_t : dy16_t;
        Tensor dx = be.Empty(XShape(d), DType::kF32, "dx"),
               dw = be.Empty(WShape(d), DType::kF32, "dw"), db = be.Empty({d.k}, DType::kF32, "db");
        Tensor* bias = d.bias ? &db : nullptr;
        be.Conv2dBackward(*plan, x_t, g, w_t, &dx, &dw, bias, false);
        got[k] = {ToHost(be, dx), ToHost(be, dw)};
        if (d.bias) got[k].push_back(ToHost(be, db));
        be.Conv2dBackwardData(*plan, g, w_t, &dx);
        be.Conv2dBackwardWeights(*plan, x_t, g, &dw, bias, true);
        got[k].push_back(ToHost(be, dx));
        got[k].push_back(ToHost(be, dw));
        if (d.bias) got[k].push_back(ToHost(be, db));
      }
      EXPECT_EQ(got[1], got[0]);
    }
  }
  if (ran == 0) GTEST_SKIP() << be.name() << ": no bf16 dy";
}

// Conv2dDesc::dx_sub (where the backend writes it: the CPU's strided 1x1s it runs subsampled, as
// a ResNet's shortcut, fp32 and bf16): the input gradient at the pixels the convolution reads is
// the whole one's there, bit for bit, from both passes in one call and from the data pass alone;
// the weight gradient is unchanged; and no other convolution offers it.
TEST_P(ConvTest, SampledInputGradientIsTheWholeOnesPixels) {
  Backend& be = backend();
  int ran = 0;
  uint32_t seed = 9300;
  for (const Precision p : {Precision::kF32, Precision::kBF16}) {
    for (Conv2dDesc d : Cases(p)) {
      d.x_nhwc = d.y_nhwc = true;
      if (!be.Supports(d)) continue;  // bf16 without oneDNN's bf16 kernels
      Conv2dDesc sub = d;
      sub.dx_sub = true;
      const auto whole_plan = be.PrepareConv2d(d);
      const bool cpu = be.device() == Device::kCpu;
      EXPECT_EQ(be.Supports(sub), cpu && cpu::CpuBackend::SubsamplesInput(sub) &&
                                      !cpu::CpuBackend::PlannedGemm(*whole_plan))
          << d.ToString();
      if (!be.Supports(sub)) continue;
      SCOPED_TRACE(sub.ToString());
      ++ran;
      seed += 10;
      const std::vector<float> x = ToNhwc(RandomUniform(XShape(d).numel(), seed), XShape(d)),
                               w = RandomUniform(WShape(d).numel(), seed + 1),
                               dy = ToNhwc(RandomUniform(YShape(d).numel(), seed + 2), YShape(d));
      Tensor x_t = ToDevice(be, x, XShape(d)), w_t = ToDevice(be, w, WShape(d)),
             dy_t = ToDevice(be, dy, YShape(d));
      const int64_t oh = d.out_h(), ow = d.out_w(), s = d.stride;
      const Shape sampled{d.n, d.c, oh, ow};
      Tensor dx = be.Empty(XShape(d), DType::kF32, "dx"),
             dx_s = be.Empty(sampled, DType::kF32, "s");
      Tensor dw = be.Empty(WShape(d), DType::kF32, "dw"),
             dw_s = be.Empty(WShape(d), DType::kF32, "");
      Tensor db = be.Empty({d.k}, DType::kF32, "db"), db_s = be.Empty({d.k}, DType::kF32, "db_s");
      be.Conv2dBackward(*whole_plan, x_t, dy_t, w_t, &dx, &dw, d.bias ? &db : nullptr, false);
      const auto plan = be.PrepareConv2d(sub);
      be.Conv2dBackward(*plan, x_t, dy_t, w_t, &dx_s, &dw_s, d.bias ? &db_s : nullptr, false);
      const std::vector<float> whole = ToHost(be, dx);
      std::vector<float> picked;  // channels-last: (n, i * s, j * s, c)
      for (int64_t n = 0; n < d.n; ++n) {
        for (int64_t i = 0; i < oh; ++i) {
          for (int64_t j = 0; j < ow; ++j) {
            const auto at = static_cast<size_t>(((n * d.h + i * s) * d.w + j * s) * d.c);
            picked.insert(
                picked.end(), whole.begin() + static_cast<std::ptrdiff_t>(at),
                whole.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(d.c)));
          }
        }
      }
      EXPECT_EQ(ToHost(be, dx_s), picked);
      EXPECT_EQ(ToHost(be, dw_s), ToHost(be, dw));
      if (d.bias) {
        EXPECT_EQ(ToHost(be, db_s), ToHost(be, db));
      }
      be.Fill(&dx_s, 7.f);
      be.Conv2dBackwardData(*plan, dy_t, w_t, &dx_s);
      EXPECT_EQ(ToHost(be, dx_s), picked) << "the data pass alone";
    }
  }
  if (ran == 0) GTEST_SKIP() << be.name() << ": writes no sampled input gradient";
}

// Conv2dDesc::x_bf16 (bf16, where the backend runs it): x handed over in bf16 gives bit for bit
// what the same values in f32 give (the convolution rounds an f32 x to bf16 itself): the forward
// (with the folded ReLU too), both backward passes in one call and the weight gradient alone,
// accumulating, NCHW and channels-last (the unfolded weight gradient of the small outputs), with
// dy in bf16 as well.
TEST_P(ConvTest, Bf16XChangesNoBit) {
  Backend& be = backend();
  int ran = 0;
  uint32_t seed = 9500;
  for (Conv2dDesc d : Cases(Precision::kBF16)) {
    for (const bool nhwc : {false, true}) {
      d.x_nhwc = d.y_nhwc = nhwc;
      d.x_bf16 = true;
      d.dy_bf16 = nhwc;
      d.relu = !nhwc;
      seed += 10;
      if (!be.Supports(d)) continue;
      SCOPED_TRACE(d.ToString());
      ++ran;
      Conv2dDesc f32 = d;
      f32.x_bf16 = false;
      const auto order = [&](const std::vector<float>& v, const Shape& shape) {
        return nhwc ? ToNhwc(v, shape) : v;
      };
      const std::vector<float> x = order(RandomUniform(XShape(d).numel(), seed), XShape(d)),
                               w = RandomUniform(WShape(d).numel(), seed + 1),
                               dy = order(RandomUniform(YShape(d).numel(), seed + 2), YShape(d));
      Tensor x_t = ToDevice(be, x, XShape(d)), x16_t = ToDeviceBf16(be, x, XShape(d));
      Tensor w_t = ToDevice(be, w, WShape(d)),
             b_t = ToDevice(be, RandomUniform(static_cast<size_t>(d.k), seed + 3), Shape{d.k});
      Tensor dy_t = d.dy_bf16 ? ToDeviceBf16(be, dy, YShape(d)) : ToDevice(be, dy, YShape(d));
      std::vector<std::vector<float>> got[2];
      for (const int k : {0, 1}) {
        const auto plan = be.PrepareConv2d(k == 0 ? f32 : d);
        const Tensor& in = k == 0 ? x_t : x16_t;
        Tensor y = be.Empty(YShape(d), DType::kF32, "y"),
               dx = be.Empty(XShape(d), DType::kF32, "dx"),
               dw = be.Empty(WShape(d), DType::kF32, "dw"), db = be.Empty({d.k}, DType::kF32, "db");
        Tensor* bias = d.bias ? &db : nullptr;
        be.Conv2dForward(*plan, in, w_t, d.bias ? &b_t : nullptr, &y);
        got[k] = {ToHost(be, y)};
        be.Conv2dBackward(*plan, in, dy_t, w_t, &dx, &dw, bias, false);
        got[k].push_back(ToHost(be, dx));
        got[k].push_back(ToHost(be, dw));
        if (d.bias) got[k].push_back(ToHost(be, db));
        be.Conv2dBackwardWeights(*plan, in, dy_t, &dw, bias, true);
        got[k].push_back(ToHost(be, dw));
        if (d.bias) got[k].push_back(ToHost(be, db));
      }
      EXPECT_EQ(got[1], got[0]);
    }
  }
  if (ran == 0) GTEST_SKIP() << be.name() << ": no bf16 x";
}

// Conv2dDesc::y_bf16 (bf16, channels-last, where the backend runs it): y written in bf16 is the
// f32 y rounded (ew::FloatToBf16), bit for bit, on every case's plan (the GEMM, subsampled and
// direct kernels, blocked-layout forwards of small outputs), with x in f32 and in bf16.
TEST_P(ConvTest, Bf16YIsTheF32OneRounded) {
  Backend& be = backend();
  int ran = 0;
  uint32_t seed = 9700;
  for (Conv2dDesc d : Cases(Precision::kBF16)) {
    for (const bool x16 : {false, true}) {
      d.x_nhwc = d.y_nhwc = true;
      d.relu = false;
      d.x_bf16 = x16;
      d.y_bf16 = true;
      seed += 10;
      if (!be.Supports(d)) continue;
      SCOPED_TRACE(d.ToString());
      ++ran;
      Conv2dDesc f32 = d;
      f32.y_bf16 = false;
      const std::vector<float> x = ToNhwc(RandomUniform(XShape(d).numel(), seed), XShape(d)),
                               w = RandomUniform(WShape(d).numel(), seed + 1);
      Tensor x_t = x16 ? ToDeviceBf16(be, x, XShape(d)) : ToDevice(be, x, XShape(d));
      Tensor w_t = ToDevice(be, w, WShape(d)),
             b_t = ToDevice(be, RandomUniform(static_cast<size_t>(d.k), seed + 3), Shape{d.k});
      Tensor y = be.Empty(YShape(d), DType::kF32, "y"),
             y16 = be.Empty(YShape(d), DType::kBF16, "y");
      be.Conv2dForward(*be.PrepareConv2d(f32), x_t, w_t, d.bias ? &b_t : nullptr, &y);
      be.Conv2dForward(*be.PrepareConv2d(d), x_t, w_t, d.bias ? &b_t : nullptr, &y16);
      EXPECT_EQ(CountNotRounded(be, y16, y), 0);
    }
  }
  if (ran == 0) GTEST_SKIP() << be.name() << ": no bf16 y";
}

INSTANTIATE_TEST_SUITE_P(All, ConvTest, ::testing::ValuesIn(TestBackends()), BackendParamName);

// The CPU's bf16 weight gradient on AMX tiles or AVX512-BF16 dot products (CpuBackend::
// TilesWeightGradient) sums the images in fixed blocks, added in block order: the same bits on one
// thread as on two, here at stride 1 and 2 (on dot products by image pairs, an odd batch's last
// image paired with zeros), with a bias, accumulating into the last gradient.
TEST(ConvTilesTest, CpuWeightGradientSameBitsOnOneAndTwoThreads) {
  std::vector<Conv2dDesc> cases = {
      MakeConv(5, 32, 14, 14, 64, 3, 3, 1, 1, true, Precision::kBF16),  // ref_cnn's conv2
      MakeConv(3, 32, 16, 16, 48, 3, 3, 2, 1, true, Precision::kBF16)};
  uint32_t seed = 9900;
  int ran = 0;
  for (Conv2dDesc& d : cases) {
    d.x_nhwc = d.y_nhwc = true;
    if (!cpu::CpuBackend::TilesWeightGradient(d)) continue;
    SCOPED_TRACE(d.ToString());
    ++ran;
    seed += 10;
    const std::vector<float> x = RandomUniform(static_cast<size_t>(XShape(d).numel()), seed),
                             dy = RandomUniform(static_cast<size_t>(YShape(d).numel()), seed + 1),
                             w0 = RandomUniform(static_cast<size_t>(WShape(d).numel()), seed + 2),
                             b0 = RandomUniform(static_cast<size_t>(d.k), seed + 3);
    std::vector<float> dw[2], db[2];
    for (const int threads : {1, 2}) {
      cpu::CpuBackend be;  // its own plans, made for this many threads
      be.SetThreads(threads);
      const auto plan = be.PrepareConv2d(d);
      EXPECT_TRUE(cpu::CpuBackend::PlannedTiles(*plan));
      Tensor x_t = InLayout(be, x, XShape(d), true), dy_t = InLayout(be, dy, YShape(d), true);
      Tensor dw_t = ToDevice(be, w0, WShape(d)), db_t = ToDevice(be, b0, Shape{d.k});
      be.Conv2dBackwardWeights(*plan, x_t, dy_t, &dw_t, &db_t, /*accumulate=*/true);
      dw[threads - 1] = ToHost(be, dw_t);
      db[threads - 1] = ToHost(be, db_t);
    }
    EXPECT_EQ(0, std::memcmp(dw[0].data(), dw[1].data(), dw[0].size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(db[0].data(), db[1].data(), db[0].size() * sizeof(float)));
  }
  cpu::CpuBackend().SetThreads(1);  // as the tests run (OMP_NUM_THREADS=1)
  if (ran == 0) GTEST_SKIP() << "no AMX tiles or AVX512-BF16 dot products on this CPU";
}

// train.winograd on the CPU: the 3x3 stride-1 fp32 convolutions with >= 32 channels run by
// oneDNN's Winograd F(4x4, 3x3) and still meet the reference at the fp32 reduction tolerance, in
// NCHW and channels-last, with a bias and with a folded ReLU; the rest stay direct.
TEST(ConvWinogradTest, CpuWinogradMatchesTheReference) {
  cpu::CpuBackend be;
  be.SetWinograd(true);
  // Not for: 16 channels, stride 2, 1x1, bf16.
  EXPECT_FALSE(cpu::CpuBackend::WinogradApplies(MakeConv(2, 16, 8, 8, 16, 3, 3, 1, 1, true)));
  EXPECT_FALSE(cpu::CpuBackend::WinogradApplies(MakeConv(2, 32, 8, 8, 32, 3, 3, 2, 1, true)));
  EXPECT_FALSE(cpu::CpuBackend::WinogradApplies(MakeConv(2, 32, 8, 8, 32, 1, 1, 1, 0, true)));
  EXPECT_FALSE(cpu::CpuBackend::WinogradApplies(
      MakeConv(2, 32, 8, 8, 32, 3, 3, 1, 1, true, Precision::kBF16)));
  Conv2dDesc layouts = MakeConv(1, 32, 9, 9, 48, 3, 3, 1, 1, false);  // no bias, odd tiles
  layouts.x_nhwc = layouts.y_nhwc = true;
  Conv2dDesc relu = MakeConv(2, 64, 8, 8, 32, 3, 3, 1, 1, true);
  relu.relu = true;
  const std::vector<Conv2dDesc> winograd = {
      MakeConv(2, 32, 12, 10, 32, 3, 3, 1, 1, true),  // a ResNet stage, non-square
      layouts, relu};
  int planned = 0;
  uint32_t seed = 900;
  for (const Conv2dDesc& d : winograd) {
    SCOPED_TRACE(d.ToString());
    ASSERT_TRUE(cpu::CpuBackend::WinogradApplies(d));
    const auto plan = be.PrepareConv2d(d);
    planned += cpu::CpuBackend::PlannedWinograd(*plan);
    seed += 10;
    const std::vector<float> x = RandomUniform(static_cast<size_t>(XShape(d).numel()), seed),
                             w = RandomUniform(static_cast<size_t>(WShape(d).numel()), seed + 1),
                             b = RandomUniform(static_cast<size_t>(d.k), seed + 2),
                             dy = RandomUniform(static_cast<size_t>(YShape(d).numel()), seed + 3);
    Tensor x_t = InLayout(be, x, XShape(d), d.x_nhwc), dy_t = InLayout(be, dy, YShape(d), d.y_nhwc);
    Tensor w_t = ToDevice(be, w, WShape(d)), b_t = ToDevice(be, b, Shape{d.k});
    Tensor y = be.Empty(YShape(d), DType::kF32, "y");
    be.Conv2dForward(*plan, x_t, w_t, d.bias ? &b_t : nullptr, &y);
    std::vector<double> ref_b = ToDouble(b), ref_y, ref_dx, ref_dw, ref_db;
    ref::Conv2dForward(d, ToDouble(x), ToDouble(w), d.bias ? &ref_b : nullptr, &ref_y);
    if (d.relu) {
      for (double& v : ref_y) v = std::max(v, 0.0);
    }
    EXPECT_TRUE(AllClose(ToHostNchw(be, y, d.y_nhwc), ref_y,
                         ForReduction(Precision::kF32, d.c * d.r * d.s + 1)))
        << "forward";
    Tensor dx = be.Empty(XShape(d), DType::kF32, "dx");
    Tensor dw = be.Empty(WShape(d), DType::kF32, "dw"), db = be.Empty({d.k}, DType::kF32, "db");
    be.Conv2dBackward(*plan, x_t, dy_t, w_t, &dx, &dw, d.bias ? &db : nullptr, false);
    ref::Conv2dBackwardData(d, ToDouble(dy), ToDouble(w), &ref_dx);
    ref::Conv2dBackwardWeights(d, ToDouble(x), ToDouble(dy), &ref_dw, d.bias ? &ref_db : nullptr,
                               false);
    EXPECT_TRUE(
        AllClose(ToHostNchw(be, dx, d.x_nhwc), ref_dx, ForReduction(Precision::kF32, d.k * 9)))
        << "backward data";
    const Tolerance wt = ForReduction(Precision::kF32, d.n * d.out_h() * d.out_w());
    EXPECT_TRUE(AllClose(ToHost(be, dw), ref_dw, wt)) << "backward weights";
    if (d.bias) {
      EXPECT_TRUE(AllClose(ToHost(be, db), ref_db, wt)) << "backward bias";
    }
  }
  // Off again: direct.
  be.SetWinograd(false);
  EXPECT_FALSE(cpu::CpuBackend::PlannedWinograd(*be.PrepareConv2d(winograd[0])));
  EXPECT_NE(be.WinogradProblem(Precision::kBF16), "");  // the start line warns instead
  // On a CPU without AVX-512 oneDNN has no Winograd kernel: every plan was direct, and the
  // backend says why (the trainer warns with it).
  if (planned == 0) {
    EXPECT_NE(be.WinogradProblem(Precision::kF32), "");
    GTEST_SKIP() << "oneDNN has no Winograd kernel on this CPU";
  }
  EXPECT_EQ(be.WinogradProblem(Precision::kF32), "");
  EXPECT_EQ(planned, static_cast<int>(winograd.size()));
}

}  // namespace
}  // namespace dptrain::testing
