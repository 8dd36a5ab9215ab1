// SPDX-License-Identifier: Apache-2.0
// Checks the reference itself before any backend is compared with it: every reference backward
// agrees with central differences of the reference forward (STYLE.md section 6: double, small
// shapes, loss sum(r * y) with random r, inputs away from kinks and ties), and a few values are
// checked by hand.
#include "tests/testing/reference_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "tests/testing/backends.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

using ref::Vec;
using Forward = std::function<Vec(const Vec&)>;

Vec RandomVec(size_t n, uint32_t seed) { return ToDouble(RandomUniform(n, seed)); }
Vec DistinctVec(size_t n, uint32_t seed) { return ToDouble(RandomDistinct(n, seed)); }

double Dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` = d/dx sum(r * f(x)) with central differences.
::testing::AssertionResult GradCheck(const Forward& f, const Vec& x, const Vec& r,
                                     const Vec& analytic) {
  if (analytic.size() != x.size()) {
    return ::testing::AssertionFailure()
           << "gradient has " << analytic.size() << " elements, input " << x.size();
  }
  const double h = kGradCheckStep;
  for (size_t i = 0; i < x.size(); ++i) {
    Vec xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double numeric = (Dot(r, f(xp)) - Dot(r, f(xm))) / (2 * h);
    const double a = analytic[i];
    const double scale = std::max({1.0, std::abs(a), std::abs(numeric)});
    if (!(std::abs(a - numeric) <= kGradCheckTol * scale)) {
      return ::testing::AssertionFailure() << "element " << i << ": analytic " << a << ", numeric "
                                           << numeric << ", |diff| " << std::abs(a - numeric);
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(ReferenceOpsTest, ConvGradients) {
  // stride, pad, kernel height, width, channels, output channels, groups, dilation
  for (const auto& [stride, pad, r, s, c, k, groups, dilation] :
       std::vector<std::array<int64_t, 8>>{{1, 1, 3, 3, 3, 2, 1, 1},
                                           {2, 0, 3, 3, 3, 2, 1, 1},
                                           {2, 2, 5, 3, 3, 2, 1, 1},
                                           {1, 0, 1, 1, 3, 2, 1, 1},
                                           {1, 1, 3, 3, 4, 4, 4, 1},
                                           {2, 1, 3, 3, 4, 6, 2, 1},
                                           {1, 2, 3, 3, 3, 2, 1, 2}}) {
    Conv2dDesc d;
    d.n = 2, d.c = c, d.h = 6, d.w = 5, d.k = k, d.r = r, d.s = s, d.stride = stride, d.pad = pad;
    d.groups = groups, d.dilation = dilation;
    SCOPED_TRACE(d.ToString());
    const Vec x = RandomVec(static_cast<size_t>(d.n * d.c * d.h * d.w), 1);
    const Vec w = RandomVec(static_cast<size_t>(d.weight_numel()), 2);
    const Vec b = RandomVec(static_cast<size_t>(d.k), 3);
    const Vec rr = RandomVec(static_cast<size_t>(d.n * d.k * d.out_h() * d.out_w()), 4);
    Vec dx, dw, db;
    ref::Conv2dBackwardData(d, rr, w, &dx);
    ref::Conv2dBackwardWeights(d, x, rr, &dw, &db, false);
    auto fx = [&](const Vec& v) {
      Vec y;
      ref::Conv2dForward(d, v, w, &b, &y);
      return y;
    };
    auto fw = [&](const Vec& v) {
      Vec y;
      ref::Conv2dForward(d, x, v, &b, &y);
      return y;
    };
    auto fb = [&](const Vec& v) {
      Vec y;
      ref::Conv2dForward(d, x, w, &v, &y);
      return y;
    };
    EXPECT_TRUE(GradCheck(fx, x, rr, dx)) << "dx";
    EXPECT_TRUE(GradCheck(fw, w, rr, dw)) << "dw";
    EXPECT_TRUE(GradCheck(fb, b, rr, db)) << "db";
  }
}

TEST(ReferenceOpsTest, ConvByHand) {
  // 1 image 1 channel 3x3, 2x2 kernel of ones, pad 0: y = sums of 2x2 blocks, + bias.
  Conv2dDesc d;
  d.n = 1, d.c = 1, d.h = 3, d.w = 3, d.k = 1, d.r = 2, d.s = 2;
  const Vec x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w = {1, 1, 1, 1}, b = {0.5};
  Vec y;
  ref::Conv2dForward(d, x, w, &b, &y);
  EXPECT_EQ(y, (Vec{12.5, 16.5, 24.5, 28.5}));
}

TEST(ReferenceOpsTest, LinearGradients) {
  LinearDesc d;
  d.n = 3, d.in = 5, d.out = 4;
  const Vec x = RandomVec(15, 11), w = RandomVec(20, 12), b = RandomVec(4, 13);
  const Vec rr = RandomVec(12, 14);
  Vec dx, dw, db;
  ref::LinearBackwardData(d, rr, w, &dx);
  ref::LinearBackwardWeights(d, x, rr, &dw, &db, false);
  auto fx = [&](const Vec& v) {
    Vec y;
    ref::LinearForward(d, v, w, &b, &y);
    return y;
  };
  auto fw = [&](const Vec& v) {
    Vec y;
    ref::LinearForward(d, x, v, &b, &y);
    return y;
  };
  auto fb = [&](const Vec& v) {
    Vec y;
    ref::LinearForward(d, x, w, &v, &y);
    return y;
  };
  EXPECT_TRUE(GradCheck(fx, x, rr, dx)) << "dx";
  EXPECT_TRUE(GradCheck(fw, w, rr, dw)) << "dw";
  EXPECT_TRUE(GradCheck(fb, b, rr, db)) << "db";

  // Accumulate adds exactly the same gradient on top.
  Vec dw2 = dw, db2 = db;
  ref::LinearBackwardWeights(d, x, rr, &dw2, &db2, true);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_DOUBLE_EQ(dw2[i], 2 * dw[i]);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_DOUBLE_EQ(db2[i], 2 * db[i]);
}

TEST(ReferenceOpsTest, PoolGradients) {
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAvg}) {
    for (const auto& [k, stride, pad] :
         std::vector<std::array<int64_t, 3>>{{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {5, 3, 2}}) {
      PoolDesc d;
      d.kind = kind, d.n = 2, d.c = 2, d.h = 7, d.w = 6, d.kernel = k, d.stride = stride;
      d.pad = pad;
      SCOPED_TRACE(std::to_string(static_cast<int>(kind)) + " k" + std::to_string(k) + " s" +
                   std::to_string(stride) + " p" + std::to_string(pad));
      // Distinct values with gaps of 2/168 >> the step: no argmax change under +-h.
      const Vec x = DistinctVec(static_cast<size_t>(d.n * d.c * d.h * d.w), 21);
      const Vec rr = RandomVec(static_cast<size_t>(d.n * d.c * d.out_h() * d.out_w()), 22);
      Vec dx;
      ref::PoolBackward(d, x, rr, &dx);
      auto f = [&](const Vec& v) {
        Vec y;
        ref::PoolForward(d, v, &y);
        return y;
      };
      EXPECT_TRUE(GradCheck(f, x, rr, dx));
    }
  }
}

TEST(ReferenceOpsTest, PoolByHand) {
  PoolDesc d;
  d.n = 1, d.c = 1, d.h = 2, d.w = 2, d.kernel = 2, d.stride = 1, d.pad = 1;  // 3x3 output
  const Vec x = {1, 2, 3, 4};
  Vec y;
  d.kind = PoolKind::kAvg;  // padding counts: every window divides by 4
  ref::PoolForward(d, x, &y);
  EXPECT_EQ(y, (Vec{0.25, 0.75, 0.5, 1.0, 2.5, 1.5, 0.75, 1.75, 1.0}));
  d.kind = PoolKind::kMax;
  ref::PoolForward(d, x, &y);
  EXPECT_EQ(y, (Vec{1, 2, 2, 3, 4, 4, 3, 4, 4}));
  // Ties: the first maximum in row-major window order gets the gradient.
  d.pad = 0;
  Vec dx;
  ref::PoolBackward(d, Vec{5, 5, 5, 5}, Vec{1.0}, &dx);
  EXPECT_EQ(dx, (Vec{1, 0, 0, 0}));
}

TEST(ReferenceOpsTest, ReluAndDropoutGradients) {
  const Vec x = DistinctVec(31, 31), rr = RandomVec(31, 32);
  Vec y, dx;
  ref::ReluForward(x, &y);
  ref::ReluBackward(y, rr, &dx);
  auto relu = [](const Vec& v) {
    Vec out;
    ref::ReluForward(v, &out);
    return out;
  };
  EXPECT_TRUE(GradCheck(relu, x, rr, dx)) << "relu";

  ref::DropoutBackward(rr, 0.3f, 77, &dx);
  auto drop = [](const Vec& v) {
    Vec out;
    ref::DropoutForward(v, 0.3f, 77, &out);
    return out;
  };
  EXPECT_TRUE(GradCheck(drop, x, rr, dx)) << "dropout";
  // p = 0 is the identity.
  ref::DropoutForward(x, 0.0f, 5, &y);
  EXPECT_EQ(y, x);
}

// Inputs spread over [-8, 8] so every branch (both sides of each kink) is exercised; distinct
// values keep them off the kinks themselves.
TEST(ReferenceOpsTest, ActivationGradients) {
  Vec x = DistinctVec(61, 33);
  for (double& v : x) v *= 8.0;
  const Vec rr = RandomVec(61, 34);
  for (const auto& c : ref::ActivationCases()) {
    SCOPED_TRACE(c.name);
    Vec dx;
    ref::ActivationBackward(c.f, x, rr, &dx);
    auto f = [&](const Vec& v) {
      Vec out;
      ref::ActivationForward(c.f, v, &out);
      return out;
    };
    EXPECT_TRUE(GradCheck(f, x, rr, dx));
  }
  // ReLU6 by hand.
  Vec y;
  ref::ActivationForward(ref::ActivationCases()[0].f, {-1.0, 0.5, 7.0}, &y);
  EXPECT_EQ(y, (Vec{0.0, 0.5, 6.0}));
}

TEST(ReferenceOpsTest, BatchNormGradients) {
  for (const ref::BatchNormShape& s :
       {ref::BatchNormShape{4, 3, 1}, ref::BatchNormShape{2, 2, 6}, ref::BatchNormShape{3, 1, 4}}) {
    SCOPED_TRACE(std::to_string(s.n) + "x" + std::to_string(s.c) + "x" + std::to_string(s.spatial));
    const size_t size = static_cast<size_t>(s.n * s.c * s.spatial), c = static_cast<size_t>(s.c);
    const Vec x = RandomVec(size, 41), rr = RandomVec(size, 42);
    const Vec gamma = RandomVec(c, 43), beta = RandomVec(c, 44);
    BatchNormArgs args;
    auto forward = [&](const Vec& xv, const Vec& g, const Vec& b, Vec* sm, Vec* si) {
      Vec rm(c, 0.0), rv(c, 1.0), y, sm_, si_;
      ref::BatchNormForwardTraining(args, s, xv, g, b, &rm, &rv, &y, sm ? sm : &sm_,
                                    si ? si : &si_);
      return y;
    };
    Vec sm, si, dx, dg, db;
    forward(x, gamma, beta, &sm, &si);
    ref::BatchNormBackward(s, x, rr, gamma, sm, si, &dx, &dg, &db, false);
    auto fx = [&](const Vec& v) { return forward(v, gamma, beta, nullptr, nullptr); };
    auto fg = [&](const Vec& v) { return forward(x, v, beta, nullptr, nullptr); };
    auto fb = [&](const Vec& v) { return forward(x, gamma, v, nullptr, nullptr); };
    EXPECT_TRUE(GradCheck(fx, x, rr, dx)) << "dx";
    EXPECT_TRUE(GradCheck(fg, gamma, rr, dg)) << "dgamma";
    EXPECT_TRUE(GradCheck(fb, beta, rr, db)) << "dbeta";
  }
}

TEST(ReferenceOpsTest, BatchNormRunningStatsByHand) {
  // One channel, values 1..4: mean 2.5, biased var 1.25, unbiased 5/3.
  const ref::BatchNormShape s{4, 1, 1};
  BatchNormArgs args;
  args.momentum = 0.1;
  Vec rm = {1.0}, rv = {2.0}, y, sm, si;
  ref::BatchNormForwardTraining(args, s, {1, 2, 3, 4}, {1.0}, {0.0}, &rm, &rv, &y, &sm, &si);
  EXPECT_DOUBLE_EQ(sm[0], 2.5);
  EXPECT_DOUBLE_EQ(si[0], 1.0 / std::sqrt(1.25 + args.eps));
  EXPECT_DOUBLE_EQ(rm[0], 0.9 * 1.0 + 0.1 * 2.5);
  EXPECT_DOUBLE_EQ(rv[0], 0.9 * 2.0 + 0.1 * (5.0 / 3.0));
}

TEST(ReferenceOpsTest, SoftmaxCrossEntropyGradient) {
  const int64_t n = 3, k = 5;
  const Vec logits = RandomVec(15, 51);
  const std::vector<int32_t> labels = {4, 0, 2};
  Vec probs, dlogits;
  double loss = 0.0;
  int64_t correct = 0;
  ref::SoftmaxCrossEntropy(n, k, logits, labels, &probs, &loss, &correct);
  ref::SoftmaxCrossEntropyBackward(n, k, probs, labels, 1.0, &dlogits);
  auto f = [&](const Vec& v) {
    Vec p;
    double l = 0.0;
    int64_t cnt = 0;
    ref::SoftmaxCrossEntropy(n, k, v, labels, &p, &l, &cnt);
    return Vec{l};
  };
  EXPECT_TRUE(GradCheck(f, logits, Vec{1.0}, dlogits));
}

// Label smoothing: the loss is F.cross_entropy(x, y, label_smoothing=0.1, reduction="sum") of
// PyTorch 1.13 in float64 on these logits, and the gradient passes a numerical check.
TEST(ReferenceOpsTest, SoftmaxCrossEntropyWithLabelSmoothingIsPyTorchs) {
  const int64_t n = 3, k = 5;
  const Vec logits = {1.5409961082440433,   -0.2934289057609464, -2.1787893820745574,
                      0.5684312772806678,   -1.084522342424021,  -1.3985953953708767,
                      0.4033468476292993,   0.8380263329976598,  -0.7192575784693592,
                      -0.40334352493217457, -0.5966353626151273, 0.18203648506130554,
                      -0.8566745932963743,  1.100604170903427,   -1.0711873631091473};
  const std::vector<int32_t> labels = {1, 4, 0};
  Vec probs, dlogits;
  double loss = 0.0;
  int64_t correct = 0;
  ref::SoftmaxCrossEntropy(n, k, logits, labels, &probs, &loss, &correct, 0.1);
  EXPECT_NEAR(loss, 6.6354884538501491, 1e-12);
  ref::SoftmaxCrossEntropyBackward(n, k, probs, labels, 1.0, &dlogits, 0.1);
  auto f = [&](const Vec& v) {
    Vec p;
    double l = 0.0;
    int64_t cnt = 0;
    ref::SoftmaxCrossEntropy(n, k, v, labels, &p, &l, &cnt, 0.1);
    return Vec{l};
  };
  EXPECT_TRUE(GradCheck(f, logits, Vec{1.0}, dlogits));
}

TEST(ReferenceOpsTest, SoftmaxCrossEntropyLargeLogits) {
  // Shifting every logit by 1e3 changes nothing.
  const Vec logits = {1.0, 2.0, 3.0, 0.5, 0.5, 0.1};
  Vec shifted = logits;
  for (double& v : shifted) v += 1e3;
  Vec p1, p2;
  double l1 = 0.0, l2 = 0.0;
  int64_t c1 = 0, c2 = 0;
  ref::SoftmaxCrossEntropy(2, 3, logits, {2, 1}, &p1, &l1, &c1);
  ref::SoftmaxCrossEntropy(2, 3, shifted, {2, 1}, &p2, &l2, &c2);
  EXPECT_TRUE(std::isfinite(l2));
  EXPECT_NEAR(l1, l2, 1e-10);
  for (size_t i = 0; i < p1.size(); ++i) EXPECT_NEAR(p1[i], p2[i], 1e-12);
  EXPECT_EQ(c1, 1);  // row 0 argmax 2 = label; row 1 ties 0/1 -> 0 != label 1
  EXPECT_EQ(c2, 1);
}

TEST(ReferenceOpsTest, MseGradient) {
  const Vec y = RandomVec(9, 61), t = RandomVec(9, 62);
  Vec dy;
  ref::MseBackward(y, t, 1.0, &dy);
  auto f = [&](const Vec& v) { return Vec{ref::MseLoss(v, t)}; };
  EXPECT_TRUE(GradCheck(f, y, Vec{1.0}, dy));
}

TEST(ReferenceOpsTest, OptimizersByHand) {
  // SGD with momentum 0.5 and Nesterov: step 1 buf = g, d = g + 0.5 g.
  ew::SgdHyper sgd{0.125f, 0.5f, 0.0f, 1.0f, true};  // dyadic: exact in f32 and double
  Vec p = {1.0}, buf = {0.0};
  ref::SgdStep(sgd, &p, {2.0}, &buf);
  EXPECT_DOUBLE_EQ(buf[0], 2.0);
  EXPECT_DOUBLE_EQ(p[0], 1.0 - 0.125 * (2.0 + 0.5 * 2.0));
  // AdamW step 1: mhat = g, vhat = g^2, so p -= lr * sign(g) (eps aside), after decay.
  ew::AdamWHyper adam{0.5f, 0.5f, 0.75f, 0.0f, 0.5f, 1.0f, 0.5f, 0.25f};
  Vec q = {2.0}, m = {0.0}, v = {0.0};
  ref::AdamWStep(adam, &q, {-3.0}, &m, &v);
  EXPECT_DOUBLE_EQ(q[0], 2.0 * (1.0 - 0.25) + 0.5);
}

}  // namespace
}  // namespace dptrain::testing
