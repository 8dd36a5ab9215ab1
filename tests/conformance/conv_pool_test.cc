// SPDX-License-Identifier: Apache-2.0
// The fused convolution + ReLU + 2x2 max pool (ConvPoolDesc) on every backend that runs it,
// against the double reference of the three ops in a row: the pooled output, and the weight and
// bias gradients (overwrite and accumulate) from a pooled gradient. First-layer shapes: 1-4 input
// channels, kernels 1-5 (and non-square), padding 0-2, output channels that are not a multiple of
// 16, odd sizes whose last row or column the pool drops, both layouts of input and output, fp32 and
// bf16. Inputs, weights and gradients are bf16 values, so bf16 computes exactly the f32 products
// and both precisions are held to the f32 tolerance of their sums (and a window's two largest
// values, apart by far more than that, give every backend the same maximum).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/elementwise.h"
#include "tests/testing/backends.h"
#include "tests/testing/reference_ops.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

ConvPoolDesc MakeConvPool(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r,
                          int64_t s, int64_t pad, bool bias, Precision p, bool x_nhwc,
                          bool y_nhwc) {
  ConvPoolDesc d;
  Conv2dDesc& cd = d.conv;
  cd.n = n, cd.c = c, cd.h = h, cd.w = w, cd.k = k, cd.r = r, cd.s = s, cd.pad = pad;
  cd.bias = bias, cd.precision = p, cd.relu = true, cd.x_nhwc = x_nhwc, cd.y_nhwc = y_nhwc;
  PoolDesc& pd = d.pool;
  pd.kind = PoolKind::kMax, pd.n = n, pd.c = k, pd.h = cd.out_h(), pd.w = cd.out_w();
  pd.kernel = 2, pd.stride = 2, pd.nhwc = y_nhwc;
  return d;
}

std::vector<ConvPoolDesc> Cases(Precision p) {
  std::vector<ConvPoolDesc> all;
  for (const bool x_nhwc : {false, true}) {
    for (const bool y_nhwc : {true, false}) {
      all.push_back(MakeConvPool(3, 1, 10, 9, 32, 3, 3, 1, true, p, x_nhwc, y_nhwc));  // ref_cnn's
      all.push_back(MakeConvPool(2, 3, 11, 12, 20, 5, 5, 2, false, p, x_nhwc, y_nhwc));  // RGB
    }
  }
  all.push_back(MakeConvPool(1, 4, 7, 7, 16, 3, 3, 0, true, p, false, true));   // no padding
  all.push_back(MakeConvPool(2, 2, 6, 8, 40, 1, 1, 0, true, p, false, true));   // 1x1, 3 steps
  all.push_back(MakeConvPool(2, 1, 9, 8, 8, 3, 2, 1, true, p, false, true));    // 3x2 kernel
  all.push_back(MakeConvPool(1, 1, 3, 3, 1, 3, 3, 1, false, p, false, false));  // one channel
  all.push_back(MakeConvPool(2, 2, 9, 10, 16, 7, 7, 3, true, p, true, true));   // 7x7: the largest
  // Channels-last steps all full (the CPU's AVX-512 weight gradient), an odd number of columns.
  all.push_back(MakeConvPool(2, 1, 8, 11, 32, 3, 3, 1, true, p, true, true));
  all.push_back(MakeConvPool(2, 3, 6, 14, 32, 5, 5, 2, true, p, false, true));
  return all;
}

// Values that bf16 holds exactly.
std::vector<float> Bf16Values(size_t n, uint32_t seed) {
  std::vector<float> v = RandomUniform(n, seed);
  for (float& f : v) f = ew::Bf16ToFloat(ew::FloatToBf16(f));
  return v;
}

// Reorders NCHW values to channels-last when `nhwc`, and back.
std::vector<float> Layout(const std::vector<float>& v, const Shape& s, bool nhwc) {
  return nhwc ? ToNhwc(v, s) : v;
}
std::vector<float> Unlayout(const std::vector<float>& v, const Shape& s, bool nhwc) {
  return nhwc ? FromNhwc(v, s) : v;
}

struct Reference {
  std::vector<double> full, y, dw, db;
};

// The three ops in a row in double: convolution, ReLU, pool; then the gradient of the pooled
// output gated by the ReLU, scattered by the pool and taken to the weights.
Reference Compute(const ConvPoolDesc& d, const std::vector<float>& x, const std::vector<float>& w,
                  const std::vector<float>& b, const std::vector<float>& dy) {
  Reference r;
  const std::vector<double> xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b);
  std::vector<double> conv, dfull, gated;
  ref::Conv2dForward(d.conv, xd, wd, d.conv.bias ? &bd : nullptr, &conv);
  ref::ReluForward(conv, &r.full);
  ref::PoolForward(d.pool, r.full, &r.y);
  ref::ReluBackward(r.y, ToDouble(dy), &gated);
  ref::PoolBackward(d.pool, r.full, gated, &dfull);
  ref::Conv2dBackwardWeights(d.conv, xd, dfull, &r.dw, d.conv.bias ? &r.db : nullptr, false);
  return r;
}

class ConvPoolTest : public BackendTest {
 protected:
  // False when the backend does not run this case (a fusion: without it the graph runs the
  // convolution and the pool).
  bool Check(const ConvPoolDesc& d, uint32_t seed) {
    SCOPED_TRACE(d.ToString());
    Backend& be = backend();
    if (!be.Supports(d)) return false;
    const Conv2dDesc& c = d.conv;
    const Shape xs{c.n, c.c, c.h, c.w}, ws{c.k, c.c, c.r, c.s},
        ys{c.n, c.k, d.pool.out_h(), d.pool.out_w()};
    const auto x = Bf16Values(static_cast<size_t>(xs.numel()), seed);
    const auto w = Bf16Values(static_cast<size_t>(ws.numel()), seed + 1);
    const auto b = Bf16Values(static_cast<size_t>(c.k), seed + 2);
    const auto dy = Bf16Values(static_cast<size_t>(ys.numel()), seed + 3);
    const Reference want = Compute(d, x, w, b, dy);

    Tensor tx = ToDevice(be, Layout(x, xs, c.x_nhwc), xs), tw = ToDevice(be, w, ws),
           tb = ToDevice(be, b, Shape{c.k}), ty = ToDevice(be, std::vector<float>(dy.size()), ys),
           tdy = ToDevice(be, Layout(dy, ys, d.pool.nhwc), ys);
    Tensor pos = be.Empty(ys, DType::kU8, "window positions");
    const Tolerance fwd = ForReduction(Precision::kF32, c.c * c.r * c.s + 1);
    // Inference (no window positions), then training.
    be.ConvPoolForward(d, tx, tw, c.bias ? &tb : nullptr, &ty, nullptr);
    EXPECT_TRUE(AllClose(Unlayout(ToHost(be, ty), ys, d.pool.nhwc), want.y, fwd)) << "inference";
    be.ConvPoolForward(d, tx, tw, c.bias ? &tb : nullptr, &ty, &pos);
    EXPECT_TRUE(AllClose(Unlayout(ToHost(be, ty), ys, d.pool.nhwc), want.y, fwd)) << "training";
    // ws: the window position in bits 0-1, bit 2 the ReLU's gate (y > 0), nothing else.
    {
      const std::vector<float> yv = ToHost(be, ty);
      std::vector<uint8_t> pv(yv.size());
      be.CopyToHost(pos, pv.data());
      int64_t wrong = 0;
      for (size_t i = 0; i < pv.size(); ++i)
        wrong += pv[i] >= 8 || ((pv[i] & 4) != 0) != (yv[i] > 0);
      EXPECT_EQ(wrong, 0) << "window positions whose gate bit is not y > 0";
    }

    const Tolerance bwd = ForReduction(Precision::kF32, c.n * c.out_h() * c.out_w());
    Tensor tdw = ToDevice(be, std::vector<float>(w.size(), 7.f), ws),
           tdb = ToDevice(be, std::vector<float>(b.size(), 7.f), Shape{c.k});
    be.ConvPoolBackward(d, tx, ty, tdy, pos, &tdw, c.bias ? &tdb : nullptr, false);
    EXPECT_TRUE(AllClose(ToHost(be, tdw), want.dw, bwd)) << "weight gradient";
    if (c.bias) {
      EXPECT_TRUE(AllClose(ToHost(be, tdb), want.db, bwd)) << "bias gradient";
    }
    be.ConvPoolBackward(d, tx, ty, tdy, pos, &tdw, c.bias ? &tdb : nullptr, true);
    std::vector<double> twice = want.dw, twice_b = want.db;
    for (double& v : twice) v *= 2;
    for (double& v : twice_b) v *= 2;
    EXPECT_TRUE(AllClose(ToHost(be, tdw), twice, bwd)) << "accumulated weight gradient";
    if (c.bias) {
      EXPECT_TRUE(AllClose(ToHost(be, tdb), twice_b, bwd)) << "accumulated bias";
    }
    return true;
  }
  void CheckAll(Precision p, uint32_t seed) {
    int ran = 0;
    for (const ConvPoolDesc& d : Cases(p)) ran += Check(d, seed += 10) ? 1 : 0;
    if (ran == 0) GTEST_SKIP() << backend().name() << " does not fuse convolution and pool";
  }
};

TEST_P(ConvPoolTest, MatchesConvReluPoolFp32) { CheckAll(Precision::kF32, 100); }

TEST_P(ConvPoolTest, MatchesConvReluPoolBf16) { CheckAll(Precision::kBF16, 500); }

// bf16 computes on bf16 operands: a pooled gradient that bf16 does not hold gives the weight
// gradient of that gradient rounded to bf16 (ew::FloatToBf16, to nearest even), to the bit, in
// both layouts (the channels-last path rounds whole vectors, the other one lane by lane).
TEST_P(ConvPoolTest, Bf16RoundsThePooledGradientToNearestEven) {
  Backend& be = backend();
  int ran = 0;
  uint32_t seed = 900;
  for (const ConvPoolDesc& d : Cases(Precision::kBF16)) {
    if (!be.Supports(d)) continue;
    SCOPED_TRACE(d.ToString());
    ++ran;
    const Conv2dDesc& c = d.conv;
    const Shape xs{c.n, c.c, c.h, c.w}, ws{c.k, c.c, c.r, c.s},
        ys{c.n, c.k, d.pool.out_h(), d.pool.out_w()};
    std::vector<float> dy = RandomUniform(static_cast<size_t>(ys.numel()), seed += 10);
    // Ties: halfway between two bf16 values, with an even and an odd last kept bit.
    if (dy.size() >= 2) dy[0] = ew::Bf16ToFloat(0x3f80) + 0x1p-8f, dy[1] = 0x1.01p0f + 0x1p-8f;
    std::vector<float> rounded = dy;
    for (float& f : rounded) f = ew::Bf16ToFloat(ew::FloatToBf16(f));
    ASSERT_NE(dy, rounded);
    Tensor tx = ToDevice(be, Bf16Values(static_cast<size_t>(xs.numel()), seed + 1), xs),
           tw = ToDevice(be, Bf16Values(static_cast<size_t>(ws.numel()), seed + 2), ws),
           tb = ToDevice(be, Bf16Values(static_cast<size_t>(c.k), seed + 3), Shape{c.k}),
           ty = ToDevice(be, std::vector<float>(dy.size()), ys);
    Tensor pos = be.Empty(ys, DType::kU8, "window positions");
    be.ConvPoolForward(d, tx, tw, c.bias ? &tb : nullptr, &ty, &pos);
    std::vector<float> got[2], got_b[2];
    for (int i = 0; i < 2; ++i) {
      Tensor tdy = ToDevice(be, Layout(i == 0 ? dy : rounded, ys, d.pool.nhwc), ys);
      Tensor tdw = ToDevice(be, std::vector<float>(static_cast<size_t>(ws.numel())), ws),
             tdb = ToDevice(be, std::vector<float>(static_cast<size_t>(c.k)), Shape{c.k});
      be.ConvPoolBackward(d, tx, ty, tdy, pos, &tdw, c.bias ? &tdb : nullptr, false);
      got[i] = ToHost(be, tdw), got_b[i] = ToHost(be, tdb);
    }
    EXPECT_EQ(got[0], got[1]) << "weight gradient";
    EXPECT_EQ(got_b[0], got_b[1]) << "bias gradient";
  }
  if (ran == 0) GTEST_SKIP() << backend().name() << " does not fuse convolution and pool";
}

// The CPU kernels keep a kernel's sums of a step in a local array of 7 x 7: a larger kernel runs
// unfused (the graph then runs the convolution and the pool).
TEST_P(ConvPoolTest, CpuFusesKernelsUpTo7x7) {
  Backend& be = backend();
  if (be.name() != "cpu") GTEST_SKIP() << "the 7 x 7 bound is the CPU kernels'";
  for (const int64_t r : {7, 8}) {
    const ConvPoolDesc d =
        MakeConvPool(2, 1, 12, 12, 16, r, r, 3, true, Precision::kF32, true, true);
    ASSERT_TRUE(d.Valid());
    EXPECT_EQ(be.Supports(d), r <= 7) << r << "x" << r;
  }
}

// What the fused op is for, and nothing else: each descriptor below differs from a valid one in
// one field, and ConvPoolDesc::Valid refuses it (so does every backend).
TEST(ConvPoolDescTest, ValidOnlyForFirstLayersBeforeA2x2Pool) {
  const ConvPoolDesc ok = MakeConvPool(2, 3, 8, 8, 16, 3, 3, 1, true, Precision::kF32, false, true);
  EXPECT_TRUE(ok.Valid());
  const auto refused = [&](const char* what, auto change) {
    ConvPoolDesc d = ok;
    change(d);
    EXPECT_FALSE(d.Valid()) << what;
  };
  refused("5 input channels", [](ConvPoolDesc& d) { d.conv.c = 5; });
  refused("stride 2", [](ConvPoolDesc& d) { d.conv.stride = 2; });
  refused("no ReLU", [](ConvPoolDesc& d) { d.conv.relu = false; });
  refused("groups", [](ConvPoolDesc& d) { d.conv.c = d.conv.groups = 2; });
  refused("dilation", [](ConvPoolDesc& d) { d.conv.dilation = 2; });
  refused("3x3 pool", [](ConvPoolDesc& d) { d.pool.kernel = 3; });
  refused("stride-1 pool", [](ConvPoolDesc& d) { d.pool.stride = 1; });
  refused("average pool", [](ConvPoolDesc& d) { d.pool.kind = PoolKind::kAvg; });
  refused("pool over another shape", [](ConvPoolDesc& d) { d.pool.h = 6; });
  refused("ceil mode on an odd size", [](ConvPoolDesc& d) {
    d.conv.h = 7;
    d.pool.h = 7;
    d.pool.ceil_mode = true;
  });
}

INSTANTIATE_TEST_SUITE_P(All, ConvPoolTest, ::testing::ValuesIn(TestBackends()), BackendParamName);

}  // namespace
}  // namespace dptrain::testing
