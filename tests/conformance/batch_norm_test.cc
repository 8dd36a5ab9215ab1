// SPDX-License-Identifier: Apache-2.0
// Batch norm on every built backend against the double reference: training forward (output,
// saved mean / inverse std, running statistics with momentum and unbiased variance), inference
// forward, and backward (dx, dgamma, dbeta, overwrite and accumulate) on (N, C) and (N, C, H, W).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

struct BnCase {
  Shape shape;  // (N, C) or (N, C, H, W)
  BatchNormArgs args;
};

ref::BatchNormShape RefShape(const Shape& s) {
  ref::BatchNormShape r;
  r.n = s[0];
  r.c = s[1];
  r.spatial = s.rank() == 4 ? s[2] * s[3] : 1;
  return r;
}

std::vector<BnCase> Cases() {
  BatchNormArgs def;
  BatchNormArgs other;
  other.momentum = 0.3;
  other.eps = 1e-3;
  return {
      {{4, 3}, def},          // features
      {{2, 1}, def},          // the smallest batch with an unbiased variance
      {{7, 5}, other},        // odd, other momentum / eps
      {{33, 17}, def},        // prime channels
      {{2, 3, 5, 7}, def},    // images, odd spatial
      {{1, 4, 3, 3}, other},  // batch 1: statistics over H*W only
      {{3, 13, 4, 5}, def},   // prime channels
      {{8, 2, 16, 16}, def},  // long reductions
      // Split over blocks of whole samples on CUDA (kernels::BatchNormParts): 9 parts of 1 or 2
      // samples with planes larger than a block, 2 parts of 64 with planes smaller than one.
      {{17, 3, 48, 48}, def},
      {{128, 2, 8, 8}, def},
  };
}

// Inputs with a per-channel offset and spread (mean 2c - 3, std ~ (c + 1) / 2): catches
// one-pass variance cancellation and channel mix-ups.
std::vector<float> MakeX(const ref::BatchNormShape& s, uint32_t seed) {
  std::vector<float> x = RandomUniform(static_cast<size_t>(s.n * s.c * s.spatial), seed);
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.c; ++c) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        float& v = x[static_cast<size_t>((n * s.c + c) * s.spatial + i)];
        v = v * static_cast<float>(c + 1) + static_cast<float>(2 * c - 3);
      }
    }
  }
  return x;
}

class BatchNormTest : public BackendTest {};

TEST_P(BatchNormTest, ForwardTraining) {
  Backend& be = backend();
  uint32_t seed = 4000;
  for (const BnCase& bc : Cases()) {
    seed += 10;
    SCOPED_TRACE("x " + bc.shape.ToString());
    const ref::BatchNormShape s = RefShape(bc.shape);
    const std::vector<float> x = MakeX(s, seed);
    const std::vector<float> gamma = RandomUniform(static_cast<size_t>(s.c), seed + 1, 0.5f, 1.5f);
    const std::vector<float> beta = RandomUniform(static_cast<size_t>(s.c), seed + 2);
    const std::vector<float> rm0 = RandomUniform(static_cast<size_t>(s.c), seed + 3);
    const std::vector<float> rv0 = RandomUniform(static_cast<size_t>(s.c), seed + 4, 0.5f, 1.5f);

    Tensor x_t = ToDevice(be, x, bc.shape);
    Tensor g_t = ToDevice(be, gamma, {s.c});
    Tensor b_t = ToDevice(be, beta, {s.c});
    Tensor rm = ToDevice(be, rm0, {s.c});
    Tensor rv = ToDevice(be, rv0, {s.c});
    Tensor y = be.Empty(bc.shape, DType::kF32, "y");
    Tensor sm = be.Empty({s.c}, DType::kF32, "save_mean");
    Tensor si = be.Empty({s.c}, DType::kF32, "save_invstd");
    be.BatchNormForwardTraining(bc.args, x_t, g_t, b_t, &rm, &rv, &y, &sm, &si);

    std::vector<double> ref_rm = ToDouble(rm0), ref_rv = ToDouble(rv0);
    std::vector<double> ref_y, ref_sm, ref_si;
    ref::BatchNormForwardTraining(bc.args, s, ToDouble(x), ToDouble(gamma), ToDouble(beta), &ref_rm,
                                  &ref_rv, &ref_y, &ref_sm, &ref_si);
    const Tolerance tol = ForReduction(Precision::kF32, s.count());
    EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, tol)) << "y";
    EXPECT_TRUE(AllClose(ToHost(be, sm), ref_sm, tol)) << "save_mean";
    EXPECT_TRUE(AllClose(ToHost(be, si), ref_si, tol)) << "save_invstd";
    EXPECT_TRUE(AllClose(ToHost(be, rm), ref_rm, tol)) << "running_mean";
    EXPECT_TRUE(AllClose(ToHost(be, rv), ref_rv, tol)) << "running_var (unbiased)";
  }
}

// Running statistics over several steps converge as PyTorch's do.
TEST_P(BatchNormTest, RunningStatsOverSteps) {
  Backend& be = backend();
  const Shape shape{4, 3, 3, 3};
  const ref::BatchNormShape s = RefShape(shape);
  BatchNormArgs args;
  args.momentum = 0.25;
  const std::vector<float> gamma(3, 1.0f), beta(3, 0.0f);
  Tensor g_t = ToDevice(be, gamma, {s.c});
  Tensor b_t = ToDevice(be, beta, {s.c});
  Tensor rm = be.Zeros({s.c}, DType::kF32, "running_mean");
  Tensor rv = be.Empty({s.c}, DType::kF32, "running_var");
  be.Fill(&rv, 1.0f);
  std::vector<double> ref_rm(3, 0.0), ref_rv(3, 1.0);
  Tensor y = be.Empty(shape, DType::kF32, "y");
  Tensor sm = be.Empty({s.c}, DType::kF32, "save_mean");
  Tensor si = be.Empty({s.c}, DType::kF32, "save_invstd");
  for (uint32_t step = 0; step < 5; ++step) {
    const std::vector<float> x = MakeX(s, 4500 + step);
    Tensor x_t = ToDevice(be, x, shape);
    be.BatchNormForwardTraining(args, x_t, g_t, b_t, &rm, &rv, &y, &sm, &si);
    std::vector<double> ref_y, ref_sm, ref_si;
    ref::BatchNormForwardTraining(args, s, ToDouble(x), ToDouble(gamma), ToDouble(beta), &ref_rm,
                                  &ref_rv, &ref_y, &ref_sm, &ref_si);
  }
  const Tolerance tol = ForReduction(Precision::kF32, 5 * s.count());
  EXPECT_TRUE(AllClose(ToHost(be, rm), ref_rm, tol)) << "running_mean";
  EXPECT_TRUE(AllClose(ToHost(be, rv), ref_rv, tol)) << "running_var";
}

TEST_P(BatchNormTest, ForwardInference) {
  Backend& be = backend();
  uint32_t seed = 5000;
  for (const BnCase& bc : Cases()) {
    seed += 10;
    SCOPED_TRACE("x " + bc.shape.ToString());
    const ref::BatchNormShape s = RefShape(bc.shape);
    const std::vector<float> x = MakeX(s, seed);
    const std::vector<float> gamma = RandomUniform(static_cast<size_t>(s.c), seed + 1, 0.5f, 1.5f);
    const std::vector<float> beta = RandomUniform(static_cast<size_t>(s.c), seed + 2);
    const std::vector<float> rm = RandomUniform(static_cast<size_t>(s.c), seed + 3, -3.f, 3.f);
    const std::vector<float> rv = RandomUniform(static_cast<size_t>(s.c), seed + 4, 0.1f, 4.0f);
    Tensor x_t = ToDevice(be, x, bc.shape);
    Tensor y = be.Empty(bc.shape, DType::kF32, "y");
    be.BatchNormForwardInference(bc.args, x_t, ToDevice(be, gamma, {s.c}),
                                 ToDevice(be, beta, {s.c}), ToDevice(be, rm, {s.c}),
                                 ToDevice(be, rv, {s.c}), &y);
    std::vector<double> ref_y;
    ref::BatchNormForwardInference(bc.args, s, ToDouble(x), ToDouble(gamma), ToDouble(beta),
                                   ToDouble(rm), ToDouble(rv), &ref_y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, ForPrecision(Precision::kF32)));
  }
}

void CheckBackward(Backend& be, bool accumulate) {
  uint32_t seed = 6000;
  for (const BnCase& bc : Cases()) {
    seed += 10;
    SCOPED_TRACE("x " + bc.shape.ToString() + (accumulate ? " accumulate" : " overwrite"));
    const ref::BatchNormShape s = RefShape(bc.shape);
    const size_t c = static_cast<size_t>(s.c);
    const std::vector<float> x = MakeX(s, seed);
    const std::vector<float> dy = RandomUniform(x.size(), seed + 1);
    const std::vector<float> gamma = RandomUniform(c, seed + 2, 0.5f, 1.5f);
    // Saved statistics as a training forward would produce them (rounded to f32 for both sides).
    std::vector<double> rm(c, 0.0), rv(c, 1.0), y_unused, sm_d, si_d;
    ref::BatchNormForwardTraining(bc.args, s, ToDouble(x), ToDouble(gamma),
                                  std::vector<double>(c, 0.0), &rm, &rv, &y_unused, &sm_d, &si_d);
    std::vector<float> sm(c), si(c);
    for (size_t i = 0; i < c; ++i) {
      sm[i] = static_cast<float>(sm_d[i]);
      si[i] = static_cast<float>(si_d[i]);
    }
    const std::vector<float> dg0 = RandomUniform(c, seed + 3);
    const std::vector<float> db0 = RandomUniform(c, seed + 4);

    Tensor dx = be.Empty(bc.shape, DType::kF32, "dx");
    Tensor dg = ToDevice(be, dg0, {s.c});
    Tensor db = ToDevice(be, db0, {s.c});
    be.BatchNormBackward({}, ToDevice(be, x, bc.shape), ToDevice(be, dy, bc.shape), nullptr,
                         ToDevice(be, gamma, {s.c}), be.Zeros({s.c}, DType::kF32, "beta"),
                         ToDevice(be, sm, {s.c}), ToDevice(be, si, {s.c}), &dx, &dg, &db,
                         accumulate);

    std::vector<double> ref_dx, ref_dg = ToDouble(dg0), ref_db = ToDouble(db0);
    ref::BatchNormBackward(s, ToDouble(x), ToDouble(dy), ToDouble(gamma), ToDouble(sm),
                           ToDouble(si), &ref_dx, &ref_dg, &ref_db, accumulate);
    const Tolerance tol = ForReduction(Precision::kF32, s.count());
    EXPECT_TRUE(AllClose(ToHost(be, dx), ref_dx, tol)) << "dx";
    EXPECT_TRUE(AllClose(ToHost(be, dg), ref_dg, tol)) << "dgamma";
    EXPECT_TRUE(AllClose(ToHost(be, db), ref_db, tol)) << "dbeta";
  }
}

// Channels-last (BatchNormArgs::nhwc, on backends that prefer it): x, y, dy, dx in NHWC order
// against the NCHW reference, with and without the folded ReLU: forward training (statistics
// over row blocks: several blocks, and channels wider than one), inference, backward (also
// accumulating dgamma and dbeta).
TEST_P(BatchNormTest, ChannelsLastMatchesReference) {
  Backend& be = backend();
  if (!be.PrefersChannelsLast()) GTEST_SKIP() << be.name() << ": activations are NCHW only";
  std::vector<BnCase> cases;
  for (const BnCase& bc : Cases()) {
    if (bc.shape.rank() == 4) cases.push_back(bc);
  }
  cases.push_back({{16, 16, 32, 32}, {}});  // 16 blocks of 1024 rows (the 16-channel row loops)
  cases.push_back({{8, 32, 9, 9}, {}});     // the 32-channel row loops
  cases.push_back({{4, 64, 7, 5}, {}});     // the 64-channel row loops
  cases.push_back({{2, 17000, 1, 2}, {}});  // blocks of one row
  uint32_t seed = 8000;
  for (BnCase bc : cases) {
    for (const bool relu : {false, true}) {
      seed += 10;
      bc.args.nhwc = true;
      bc.args.relu = relu;
      SCOPED_TRACE("x " + bc.shape.ToString() + (relu ? " relu" : ""));
      const ref::BatchNormShape s = RefShape(bc.shape);
      const size_t c = static_cast<size_t>(s.c);
      const std::vector<float> x = MakeX(s, seed), dy = RandomUniform(x.size(), seed + 1);
      const std::vector<float> gamma = RandomUniform(c, seed + 2, 0.5f, 1.5f);
      const std::vector<float> beta = RandomUniform(c, seed + 3);
      Tensor x_t = ToDevice(be, ToNhwc(x, bc.shape), bc.shape);
      Tensor g_t = ToDevice(be, gamma, {s.c}), b_t = ToDevice(be, beta, {s.c});
      Tensor rm = be.Zeros({s.c}, DType::kF32, "running_mean");
      Tensor rv = be.Empty({s.c}, DType::kF32, "running_var");
      be.Fill(&rv, 1.0f);
      Tensor y = be.Empty(bc.shape, DType::kF32, "y");
      Tensor sm = be.Empty({s.c}, DType::kF32, "save_mean");
      Tensor si = be.Empty({s.c}, DType::kF32, "save_invstd");
      be.BatchNormForwardTraining(bc.args, x_t, g_t, b_t, &rm, &rv, &y, &sm, &si);

      std::vector<double> ref_rm(c, 0.0), ref_rv(c, 1.0), ref_y, ref_sm, ref_si;
      BatchNormArgs plain = bc.args;
      plain.relu = false;
      ref::BatchNormForwardTraining(plain, s, ToDouble(x), ToDouble(gamma), ToDouble(beta), &ref_rm,
                                    &ref_rv, &ref_y, &ref_sm, &ref_si);
      if (relu) {
        for (double& v : ref_y) v = std::max(v, 0.0);
      }
      const Tolerance tol = ForReduction(Precision::kF32, s.count());
      const std::vector<float> got_y = FromNhwc(ToHost(be, y), bc.shape);
      EXPECT_TRUE(AllClose(got_y, ref_y, tol)) << "y";
      EXPECT_TRUE(AllClose(ToHost(be, sm), ref_sm, tol)) << "save_mean";
      EXPECT_TRUE(AllClose(ToHost(be, si), ref_si, tol)) << "save_invstd";
      EXPECT_TRUE(AllClose(ToHost(be, rm), ref_rm, tol)) << "running_mean";
      EXPECT_TRUE(AllClose(ToHost(be, rv), ref_rv, tol)) << "running_var";

      Tensor y_inf = be.Empty(bc.shape, DType::kF32, "y inference");
      be.BatchNormForwardInference(bc.args, x_t, g_t, b_t, rm, rv, &y_inf);
      std::vector<double> ref_inf;
      ref::BatchNormForwardInference(plain, s, ToDouble(x), ToDouble(gamma), ToDouble(beta),
                                     ToDouble(ToHost(be, rm)), ToDouble(ToHost(be, rv)), &ref_inf);
      if (relu) {
        for (double& v : ref_inf) v = std::max(v, 0.0);
      }
      EXPECT_TRUE(AllClose(FromNhwc(ToHost(be, y_inf), bc.shape), ref_inf, tol)) << "inference";

      // Backward from the forward's saved statistics; with the ReLU, dy gated by y (in place
      // over y, as the layer runs it).
      Tensor dx = relu ? y : be.Empty(bc.shape, DType::kF32, "dx");
      Tensor dg = be.Zeros({s.c}, DType::kF32, "dgamma"), db = be.Zeros({s.c}, DType::kF32, "db");
      be.BatchNormBackward(bc.args, x_t, ToDevice(be, ToNhwc(dy, bc.shape), bc.shape),
                           relu ? &y : nullptr, g_t, b_t, sm, si, &dx, &dg, &db, false);
      std::vector<double> gated = ToDouble(dy);
      for (size_t i = 0; i < gated.size() && relu; ++i) gated[i] = got_y[i] > 0.f ? gated[i] : 0.0;
      std::vector<double> ref_dx, ref_dg(c, 0.0), ref_db(c, 0.0);
      ref::BatchNormBackward(s, ToDouble(x), gated, ToDouble(gamma), ToDouble(ToHost(be, sm)),
                             ToDouble(ToHost(be, si)), &ref_dx, &ref_dg, &ref_db, false);
      EXPECT_TRUE(AllClose(FromNhwc(ToHost(be, dx), bc.shape), ref_dx, tol)) << "dx";
      EXPECT_TRUE(AllClose(ToHost(be, dg), ref_dg, tol)) << "dgamma";
      EXPECT_TRUE(AllClose(ToHost(be, db), ref_db, tol)) << "dbeta";
      if (relu) continue;  // dx took y's buffer above
      // Accumulating parameter gradients (micro-batches): added to what dgamma and dbeta hold.
      be.BatchNormBackward(bc.args, x_t, ToDevice(be, ToNhwc(dy, bc.shape), bc.shape), nullptr, g_t,
                           b_t, sm, si, &dx, &dg, &db, /*accumulate=*/true);
      for (size_t j = 0; j < c; ++j) ref_dg[j] *= 2, ref_db[j] *= 2;
      EXPECT_TRUE(AllClose(FromNhwc(ToHost(be, dx), bc.shape), ref_dx, tol)) << "dx, accumulate";
      EXPECT_TRUE(AllClose(ToHost(be, dg), ref_dg, tol)) << "dgamma, accumulate";
      EXPECT_TRUE(AllClose(ToHost(be, db), ref_db, tol)) << "dbeta, accumulate";
    }
  }
}

TEST_P(BatchNormTest, Backward) { CheckBackward(backend(), /*accumulate=*/false); }

TEST_P(BatchNormTest, BackwardAccumulate) { CheckBackward(backend(), /*accumulate=*/true); }

// A ReLU folded into the batch norm (BatchNormArgs::relu, what the graph does for a ReLU that
// alone reads a batch norm) gives exactly batch norm then ReLU: the training and inference
// outputs, the saved and running statistics, and in backward (gated by the folded output, dx
// written separately and over that output in place) dx, dgamma and dbeta; in both layouts on a
// backend that runs channels-last (the CPU backend recomputes the gate from x: to the bit).
TEST_P(BatchNormTest, FoldedReluIsBatchNormThenRelu) {
  Backend& be = backend();
  uint32_t seed = 6500;
  std::vector<BnCase> cases = Cases();
  if (be.PrefersChannelsLast()) {
    std::vector<BnCase> nhwc;
    for (const BnCase& bc : Cases()) {
      if (bc.shape.rank() == 4) nhwc.push_back(bc);
    }
    // 16 and 32 channels take the CPU backend's unrolled backward loops, 64 its generic one.
    for (const int64_t c : {16, 32, 64}) nhwc.push_back({{3, c, 5, 6}, {}});
    for (BnCase& bc : nhwc) {
      bc.args.nhwc = true;
      cases.push_back(bc);
    }
  }
  for (const BnCase& bc : cases) {
    seed += 10;
    SCOPED_TRACE("x " + bc.shape.ToString() + (bc.args.nhwc ? " channels-last" : ""));
    const int64_t c = bc.shape[1];
    // Centred inputs, so that about half of the outputs are cut by the ReLU.
    const std::vector<float> x = RandomUniform(static_cast<size_t>(bc.shape.numel()), seed);
    const std::vector<float> dy = RandomUniform(x.size(), seed + 1);
    const std::vector<float> gamma = RandomUniform(static_cast<size_t>(c), seed + 2, 0.5f, 1.5f);
    const std::vector<float> beta = RandomUniform(static_cast<size_t>(c), seed + 3);
    const std::vector<float> rv0 = RandomUniform(static_cast<size_t>(c), seed + 4, 0.5f, 1.5f);
    Tensor x_t = ToDevice(be, x, bc.shape), dy_t = ToDevice(be, dy, bc.shape);
    Tensor g_t = ToDevice(be, gamma, {c}), b_t = ToDevice(be, beta, {c});
    BatchNormArgs folded = bc.args;
    folded.relu = true;

    struct Run {
      std::vector<std::vector<float>> forward, backward, backward_in_place;
    };
    const auto run = [&](bool fold) {
      Run r;
      Tensor rm = be.Zeros({c}, DType::kF32, "running mean");
      Tensor rv = ToDevice(be, rv0, {c});
      Tensor y = be.Empty(bc.shape, DType::kF32, "y"), y_inf = be.Empty(bc.shape, DType::kF32, "y");
      Tensor sm = be.Empty({c}, DType::kF32, "save mean"), si = be.Empty({c}, DType::kF32, "si");
      if (fold) {
        be.BatchNormForwardTraining(folded, x_t, g_t, b_t, &rm, &rv, &y, &sm, &si);
        be.BatchNormForwardInference(folded, x_t, g_t, b_t, rm, rv, &y_inf);
      } else {
        Tensor pre = be.Empty(bc.shape, DType::kF32, "batch norm output");
        be.BatchNormForwardTraining(bc.args, x_t, g_t, b_t, &rm, &rv, &pre, &sm, &si);
        be.ReluForward(pre, &y);
        be.BatchNormForwardInference(bc.args, x_t, g_t, b_t, rm, rv, &pre);
        be.ReluForward(pre, &y_inf);
      }
      r.forward = {ToHost(be, y),  ToHost(be, y_inf), ToHost(be, sm),
                   ToHost(be, si), ToHost(be, rm),    ToHost(be, rv)};
      for (const bool in_place : {false, true}) {
        Tensor y_copy = ToDevice(be, ToHost(be, y), bc.shape);
        Tensor dx = in_place ? y_copy : be.Empty(bc.shape, DType::kF32, "dx");
        Tensor dg = be.Zeros({c}, DType::kF32, "dgamma"), db = be.Zeros({c}, DType::kF32, "dbeta");
        if (fold) {
          be.BatchNormBackward(folded, x_t, dy_t, &y_copy, g_t, b_t, sm, si, &dx, &dg, &db, false);
        } else {
          Tensor gated = be.Empty(bc.shape, DType::kF32, "relu dx");
          be.ReluBackward(y_copy, dy_t, &gated);
          be.BatchNormBackward(bc.args, x_t, gated, nullptr, g_t, b_t, sm, si, &dx, &dg, &db,
                               false);
        }
        (in_place ? r.backward_in_place : r.backward) = {ToHost(be, dx), ToHost(be, dg),
                                                         ToHost(be, db)};
      }
      return r;
    };
    const Run want = run(false), got = run(true);
    EXPECT_EQ(got.forward, want.forward) << "forward: y, inference y, saved and running statistics";
    EXPECT_EQ(got.backward, want.backward) << "backward: dx, dgamma, dbeta";
    EXPECT_EQ(got.backward_in_place, want.backward) << "backward with dx over the folded output";
  }
}

// The bf16 variants' cases: Cases() and one image per unrolled channel count (16, 32, 64) and
// with 80 and 130 channels, each NCHW and (on a backend that prefers it) channels-last, with and
// without the folded ReLU: f(bc, seed) with bc.args set so and a seed of its own, under a trace
// naming the variant.
template <class F>
void ForEachBf16Variant(Backend& be, uint32_t seed, F f) {
  std::vector<BnCase> cases = Cases();
  // the unrolled channel counts; and more than 64, which the bf16-x loops widen 64 at a time
  for (const int64_t c : {16, 32, 64, 80, 130}) cases.push_back({{3, c, 5, 6}, {}});
  for (BnCase bc : cases) {
    for (const bool nhwc : {false, true}) {
      if (nhwc && (bc.shape.rank() != 4 || !be.PrefersChannelsLast())) continue;
      for (const bool relu : {false, true}) {
        bc.args.nhwc = nhwc;
        bc.args.relu = relu;
        seed += 10;
        SCOPED_TRACE("x " + bc.shape.ToString() + (nhwc ? " channels-last" : "") +
                     (relu ? " relu" : ""));
        f(bc, seed);
      }
    }
  }
}

// BatchNormArgs::dx_bf16 (where the backend runs it): dx written in bf16 is the f32 dx rounded
// (ew::FloatToBf16), bit for bit, with dgamma and dbeta unchanged; with and without the folded
// ReLU, NCHW and (on a backend that prefers it) channels-last, the unrolled 16- and 32-channel
// loops included.
TEST_P(BatchNormTest, Bf16InputGradientIsTheF32OneRounded) {
  Backend& be = backend();
  BatchNormArgs probe;
  probe.dx_bf16 = true;
  if (!be.Supports(probe)) GTEST_SKIP() << be.name() << ": no bf16 batch-norm input gradient";
  ForEachBf16Variant(be, 7500, [&](const BnCase& bc, uint32_t seed) {
    const int64_t c = bc.shape[1];
    const std::vector<float> x = RandomUniform(static_cast<size_t>(bc.shape.numel()), seed);
    const std::vector<float> dy = RandomUniform(x.size(), seed + 1);
    Tensor x_t = ToDevice(be, x, bc.shape), dy_t = ToDevice(be, dy, bc.shape);
    Tensor g_t = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 2, 0.5f, 1.5f), {c});
    Tensor b_t = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 3), {c});
    Tensor rm = be.Zeros({c}, DType::kF32, "running mean"), rv = be.Zeros({c}, DType::kF32, "rv");
    Tensor y = be.Empty(bc.shape, DType::kF32, "y");
    Tensor sm = be.Empty({c}, DType::kF32, "save mean"), si = be.Empty({c}, DType::kF32, "si");
    be.BatchNormForwardTraining(bc.args, x_t, g_t, b_t, &rm, &rv, &y, &sm, &si);
    BatchNormArgs half = bc.args;
    half.dx_bf16 = true;
    Tensor dx = be.Empty(bc.shape, DType::kF32, "dx"),
           dx16 = be.Empty(bc.shape, DType::kBF16, "dx");
    Tensor dg = be.Zeros({c}, DType::kF32, "dgamma"), db = be.Zeros({c}, DType::kF32, "dbeta");
    Tensor dg16 = be.Zeros({c}, DType::kF32, "dgamma"), db16 = be.Zeros({c}, DType::kF32, "db");
    const Tensor* gate = bc.args.relu ? &y : nullptr;
    be.BatchNormBackward(bc.args, x_t, dy_t, gate, g_t, b_t, sm, si, &dx, &dg, &db, false);
    be.BatchNormBackward(half, x_t, dy_t, gate, g_t, b_t, sm, si, &dx16, &dg16, &db16, false);
    EXPECT_EQ(CountNotRounded(be, dx16, dx), 0);
    EXPECT_EQ(ToHost(be, dg16), ToHost(be, dg));
    EXPECT_EQ(ToHost(be, db16), ToHost(be, db));
  });
}

// A gradient in two parts (Backend::TakesGradientParts; channels-last): BatchNormBackwardSum
// gives the bits of Add then BatchNormBackward, dx and the parameter gradients (written, and
// added to), with and without the folded ReLU, dx in f32 and (where the backend writes it) bf16,
// over the unrolled channel counts and the others.
TEST_P(BatchNormTest, GradientInTwoPartsIsTheirSums) {
  Backend& be = backend();
  if (!be.TakesGradientParts()) GTEST_SKIP() << be.name() << ": sums gradient parts first";
  ForEachBf16Variant(be, 8100, [&](const BnCase& bc, uint32_t seed) {
    if (!bc.args.nhwc) return;
    const int64_t c = bc.shape[1];
    const std::vector<float> x = RandomUniform(static_cast<size_t>(bc.shape.numel()), seed);
    Tensor x_t = ToDevice(be, x, bc.shape);
    Tensor a_t = ToDevice(be, RandomUniform(x.size(), seed + 1), bc.shape);
    Tensor b_t = ToDevice(be, RandomUniform(x.size(), seed + 4), bc.shape);
    Tensor g_t = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 2, 0.5f, 1.5f), {c});
    Tensor beta = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 3), {c});
    Tensor rm = be.Zeros({c}, DType::kF32, "running mean"), rv = be.Zeros({c}, DType::kF32, "rv");
    Tensor y = be.Empty(bc.shape, DType::kF32, "y");
    Tensor sm = be.Empty({c}, DType::kF32, "save mean"), si = be.Empty({c}, DType::kF32, "si");
    be.BatchNormForwardTraining(bc.args, x_t, g_t, beta, &rm, &rv, &y, &sm, &si);
    Tensor sum = be.Empty(bc.shape, DType::kF32, "sum");
    be.Add(a_t, b_t, &sum);
    const Tensor* gate = bc.args.relu ? &y : nullptr;
    for (const bool bf16 : {false, true}) {
      BatchNormArgs args = bc.args;
      args.dx_bf16 = bf16;
      if (!be.Supports(args)) continue;
      SCOPED_TRACE(bf16 ? "dx bf16" : "dx f32");
      const DType t = bf16 ? DType::kBF16 : DType::kF32;
      Tensor want = be.Empty(bc.shape, t, "dx"), got = be.Empty(bc.shape, t, "dx");
      Tensor dg = be.Zeros({c}, DType::kF32, "dgamma"), db = be.Zeros({c}, DType::kF32, "dbeta");
      Tensor dg2 = be.Zeros({c}, DType::kF32, "dgamma"), db2 = be.Zeros({c}, DType::kF32, "db");
      be.BatchNormBackward(args, x_t, sum, gate, g_t, beta, sm, si, &want, &dg, &db, false);
      be.BatchNormBackwardSum(args, x_t, a_t, b_t, gate, g_t, beta, sm, si, &got, &dg2, &db2,
                              false);
      const auto bytes = [&](const Tensor& v) {
        std::vector<uint8_t> out(v.bytes());
        be.CopyToHost(v, out.data());
        return out;
      };
      EXPECT_EQ(bytes(got), bytes(want)) << "dx";
      EXPECT_EQ(ToHost(be, dg2), ToHost(be, dg)) << "dgamma";
      EXPECT_EQ(ToHost(be, db2), ToHost(be, db)) << "dbeta";
      be.BatchNormBackward(args, x_t, sum, gate, g_t, beta, sm, si, &want, &dg, &db, true);
      be.BatchNormBackwardSum(args, x_t, a_t, b_t, gate, g_t, beta, sm, si, &got, &dg2, &db2, true);
      EXPECT_EQ(ToHost(be, dg2), ToHost(be, dg)) << "dgamma, accumulated";
      EXPECT_EQ(ToHost(be, db2), ToHost(be, db)) << "dbeta, accumulated";
    }
  });
}

// A batch norm applied by the residual sum that reads it (Backend::DefersBatchNormApply;
// channels-last): BatchNormAffineTraining leaves the saved and running statistics of
// BatchNormForwardTraining, and AffineAdd of its scale and shift gives, bit for bit, its output
// added to the other input (another batch norm's output, or a tensor as it is) and, with the
// ReLU, AddRelu's; in training and in inference (BatchNormAffineInference); either input, or
// both, normalised; the unrolled channel counts and others; and, where the backend writes it
// (Backend::WritesBf16Sums), a bf16 y that is that sum rounded.
TEST_P(BatchNormTest, AppliedBySumIsItsOutputAdded) {
  Backend& be = backend();
  if (!be.DefersBatchNormApply()) GTEST_SKIP() << be.name() << ": batch norms write outputs";
  uint32_t seed = 8600;
  for (const Shape& shape :
       {Shape{3, 16, 5, 6}, Shape{2, 32, 4, 4}, Shape{2, 64, 3, 3}, Shape{3, 13, 4, 5},
        Shape{8, 5, 16, 16}, Shape{8, 16, 16, 16}}) {  // the last on several threads' blocks
    const int64_t c = shape[1];
    BatchNormArgs args;
    args.nhwc = true;
    for (const int which : {1, 2, 3}) {  // bit 0: input 0 normalised, bit 1: input 1
      for (const bool relu : {false, true}) {
        for (const bool training : {true, false}) {
          seed += 10;
          SCOPED_TRACE(::testing::Message()
                       << shape.ToString() << " normalised " << which << (relu ? " relu" : "")
                       << (training ? " training" : " inference"));
          const auto rand = [&](uint32_t k, float lo = -1.f, float hi = 1.f, int64_t n = 0) {
            return RandomUniform(static_cast<size_t>(n > 0 ? n : shape.numel()), seed + k, lo, hi);
          };
          Tensor x[2] = {ToDevice(be, rand(0), shape), ToDevice(be, rand(1), shape)};
          Tensor want[2], affine[2];
          std::vector<std::vector<float>> stats_want, stats_got;
          for (int k = 0; k < 2; ++k) {
            want[k] = x[k];
            if ((which & (1 << k)) == 0) continue;
            Tensor g = ToDevice(be, rand(2 + k, 0.5f, 1.5f, c), {c});
            Tensor b = ToDevice(be, rand(4 + k, -1.f, 1.f, c), {c});
            Tensor rm[2], rv[2], sm[2], si[2];
            for (int t = 0; t < 2; ++t) {
              rm[t] = ToDevice(be, rand(6, -0.1f, 0.1f, c), {c});
              rv[t] = ToDevice(be, rand(7, 0.5f, 1.5f, c), {c});
              sm[t] = be.Zeros({c}, DType::kF32, "save mean");
              si[t] = be.Zeros({c}, DType::kF32, "save invstd");
            }
            want[k] = be.Empty(shape, DType::kF32, "batch norm output");
            affine[k] = be.Empty({2 * c}, DType::kF32, "affine");
            if (training) {
              be.BatchNormForwardTraining(args, x[k], g, b, &rm[0], &rv[0], &want[k], &sm[0],
                                          &si[0]);
              be.BatchNormAffineTraining(args, x[k], g, b, &rm[1], &rv[1], &affine[k], &sm[1],
                                         &si[1]);
            } else {
              be.BatchNormForwardInference(args, x[k], g, b, rm[0], rv[0], &want[k]);
              be.BatchNormAffineInference(args, g, b, rm[0], rv[0], &affine[k]);
            }
            for (int t = 0; t < 2; ++t) {
              auto& into = t == 0 ? stats_want : stats_got;
              for (const Tensor* v : {&rm[t], &rv[t], &sm[t], &si[t]})
                into.push_back(ToHost(be, *v));
            }
          }
          EXPECT_EQ(stats_got, stats_want) << "running and saved statistics";
          Tensor sum = be.Empty(shape, DType::kF32, "sum"), got = be.Empty(shape, DType::kF32, "y");
          if (relu) {
            be.AddRelu(want[0], want[1], &sum);
          } else {
            be.Add(want[0], want[1], &sum);
          }
          be.AffineAdd(x[0], (which & 1) != 0 ? &affine[0] : nullptr, x[1],
                       (which & 2) != 0 ? &affine[1] : nullptr, relu, &got);
          EXPECT_EQ(ToHost(be, got), ToHost(be, sum));
          if (be.WritesBf16Sums()) {  // y in bf16: the f32 sum rounded
            Tensor got16 = be.Empty(shape, DType::kBF16, "y");
            be.AffineAdd(x[0], (which & 1) != 0 ? &affine[0] : nullptr, x[1],
                         (which & 2) != 0 ? &affine[1] : nullptr, relu, &got16);
            EXPECT_EQ(CountNotRounded(be, got16, sum), 0) << "bf16 y";
          }
        }
      }
    }
  }
}

// BatchNormArgs::y_bf16 (where the backend runs it): y written in bf16 is the f32 y rounded
// (ew::FloatToBf16), bit for bit, in training (the saved and running statistics unchanged) and
// in inference; as above, on images (the output a convolution reads), tails of fewer than 16
// values included.
TEST_P(BatchNormTest, Bf16OutputIsTheF32OneRounded) {
  Backend& be = backend();
  BatchNormArgs probe;
  probe.y_bf16 = true;
  if (!be.Supports(probe)) GTEST_SKIP() << be.name() << ": no bf16 batch-norm output";
  ForEachBf16Variant(be, 7800, [&](const BnCase& bc, uint32_t seed) {
    if (bc.shape.rank() != 4) return;
    const int64_t c = bc.shape[1];
    const std::vector<float> x = RandomUniform(static_cast<size_t>(bc.shape.numel()), seed);
    Tensor x_t = ToDevice(be, x, bc.shape);
    Tensor g_t = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 2, 0.5f, 1.5f), {c});
    Tensor b_t = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 3), {c});
    BatchNormArgs half = bc.args;
    half.y_bf16 = true;
    Tensor y = be.Empty(bc.shape, DType::kF32, "y"), y16 = be.Empty(bc.shape, DType::kBF16, "y");
    std::vector<float> stats[2];
    for (const int k : {0, 1}) {
      Tensor rm = be.Zeros({c}, DType::kF32, "running mean"), rv = be.Zeros({c}, DType::kF32, "rv");
      Tensor sm = be.Empty({c}, DType::kF32, "save mean"), si = be.Empty({c}, DType::kF32, "si");
      be.BatchNormForwardTraining(k == 0 ? bc.args : half, x_t, g_t, b_t, &rm, &rv,
                                  k == 0 ? &y : &y16, &sm, &si);
      for (const Tensor* t : {&rm, &rv, &sm, &si}) {
        const std::vector<float> v = ToHost(be, *t);
        stats[k].insert(stats[k].end(), v.begin(), v.end());
      }
    }
    EXPECT_EQ(CountNotRounded(be, y16, y), 0) << "training";
    EXPECT_EQ(stats[1], stats[0]);
    Tensor rm = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 4), {c});
    Tensor rv = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 5, 0.5f, 2.f), {c});
    be.BatchNormForwardInference(bc.args, x_t, g_t, b_t, rm, rv, &y);
    be.BatchNormForwardInference(half, x_t, g_t, b_t, rm, rv, &y16);
    EXPECT_EQ(CountNotRounded(be, y16, y), 0) << "inference";
  });
}

// BatchNormArgs::x_bf16 (where the backend runs it; channels-last): every pass over a bf16 x
// gives the bits of the same pass over its values widened to f32: the training forward (output in
// f32 and bf16, saved and running statistics), inference, the backward (dx in f32 and bf16, in
// one part or two, with and without the folded ReLU), and a batch norm applied by its sum
// (BatchNormAffineTraining, AffineAdd with either input or both in bf16).
TEST_P(BatchNormTest, Bf16InputIsItsValuesWidened) {
  Backend& be = backend();
  BatchNormArgs probe;
  probe.nhwc = true;
  probe.x_bf16 = true;
  if (!be.Supports(probe)) GTEST_SKIP() << be.name() << ": no bf16 batch-norm input";
  const auto bytes = [&](const Tensor& v) {
    std::vector<uint8_t> out(v.bytes());
    be.CopyToHost(v, out.data());
    return out;
  };
  ForEachBf16Variant(be, 9100, [&](const BnCase& bc, uint32_t seed) {
    if (!bc.args.nhwc) return;
    const int64_t c = bc.shape[1];
    const std::vector<float> x = RandomUniform(static_cast<size_t>(bc.shape.numel()), seed);
    Tensor x16 = ToDeviceBf16(be, x, bc.shape);
    Tensor xw = be.Empty(bc.shape, DType::kF32, "x widened");  // the same values in f32
    {
      std::vector<uint16_t> bits(x.size());
      be.CopyToHost(x16, bits.data());
      std::vector<float> wide(x.size());
      for (size_t i = 0; i < x.size(); ++i) wide[i] = ew::Bf16ToFloat(bits[i]);
      xw = ToDevice(be, wide, bc.shape);
    }
    Tensor g_t = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 2, 0.5f, 1.5f), {c});
    Tensor b_t = ToDevice(be, RandomUniform(static_cast<size_t>(c), seed + 3), {c});
    Tensor dy_a = ToDevice(be, RandomUniform(x.size(), seed + 4), bc.shape);
    Tensor dy_b = ToDevice(be, RandomUniform(x.size(), seed + 5), bc.shape);
    BatchNormArgs half = bc.args;
    half.x_bf16 = true;
    for (const bool y16 : {false, true}) {
      BatchNormArgs f = bc.args, h = half;
      f.y_bf16 = h.y_bf16 = y16;
      if (!be.Supports(h)) continue;
      SCOPED_TRACE(y16 ? "y bf16" : "y f32");
      const DType yt = y16 ? DType::kBF16 : DType::kF32;
      std::vector<std::vector<uint8_t>> got, want;
      for (const bool bf16 : {false, true}) {
        const BatchNormArgs& a = bf16 ? h : f;
        const Tensor& in = bf16 ? x16 : xw;
        auto& out = bf16 ? got : want;
        Tensor rm = be.Zeros({c}, DType::kF32, "rm"), rv = be.Zeros({c}, DType::kF32, "rv");
        Tensor sm = be.Empty({c}, DType::kF32, "sm"), si = be.Empty({c}, DType::kF32, "si");
        Tensor y = be.Empty(bc.shape, yt, "y");
        be.BatchNormForwardTraining(a, in, g_t, b_t, &rm, &rv, &y, &sm, &si);
        for (const Tensor* t : {&y, &rm, &rv, &sm, &si}) out.push_back(bytes(*t));
        if (!y16) {  // the backward: y is the folded ReLU's gate operand, f32
          for (const bool dx16 : {false, true}) {
            BatchNormArgs b = a;
            b.dx_bf16 = dx16;
            if (!be.Supports(b)) continue;
            const DType dt = dx16 ? DType::kBF16 : DType::kF32;
            Tensor dx = be.Empty(bc.shape, dt, "dx"), dx2 = be.Empty(bc.shape, dt, "dx");
            Tensor dg = be.Zeros({c}, DType::kF32, "dg"), db = be.Zeros({c}, DType::kF32, "db");
            const Tensor* gate = a.relu ? &y : nullptr;
            be.BatchNormBackward(b, in, dy_a, gate, g_t, b_t, sm, si, &dx, &dg, &db, false);
            be.BatchNormBackwardSum(b, in, dy_a, dy_b, gate, g_t, b_t, sm, si, &dx2, &dg, &db,
                                    true);
            for (const Tensor* t : {&dx, &dx2, &dg, &db}) out.push_back(bytes(*t));
          }
        }
        Tensor ry = be.Empty(bc.shape, yt, "y");
        be.BatchNormForwardInference(a, in, g_t, b_t, rm, rv, &ry);
        out.push_back(bytes(ry));
      }
      ASSERT_EQ(got.size(), want.size());
      for (size_t t = 0; t < want.size(); ++t) EXPECT_EQ(got[t], want[t]) << "tensor " << t;
    }
    if (!be.DefersBatchNormApply() || bc.args.relu) return;
    // Applied by a sum: x16 normalised as input 0, input 1 or both (the other f32 or bf16).
    Tensor aff[2] = {be.Empty({2 * c}, DType::kF32, "affine"),
                     be.Empty({2 * c}, DType::kF32, "affine")};
    for (int k = 0; k < 2; ++k) {
      Tensor rm = be.Zeros({c}, DType::kF32, "rm"), rv = be.Zeros({c}, DType::kF32, "rv");
      Tensor sm = be.Empty({c}, DType::kF32, "sm"), si = be.Empty({c}, DType::kF32, "si");
      be.BatchNormAffineTraining(k == 0 ? bc.args : half, k == 0 ? xw : x16, g_t, b_t, &rm, &rv,
                                 &aff[k], &sm, &si);
    }
    EXPECT_EQ(ToHost(be, aff[1]), ToHost(be, aff[0])) << "scale and shift";
    for (const bool relu : {false, true}) {
      for (const int which : {1, 2, 3}) {
        Tensor want = be.Empty(bc.shape, DType::kF32, "y"),
               got = be.Empty(bc.shape, DType::kF32, "y");
        const Tensor* a0 = (which & 1) != 0 ? &aff[0] : nullptr;
        const Tensor* a1 = (which & 2) != 0 ? &aff[0] : nullptr;
        be.AffineAdd(xw, a0, (which & 2) != 0 ? xw : dy_a, a1, relu, &want);
        be.AffineAdd(a0 != nullptr ? x16 : xw, a0, (which & 2) != 0 ? x16 : dy_a, a1, relu, &got);
        EXPECT_EQ(bytes(got), bytes(want)) << "normalised " << which << (relu ? " relu" : "");
        if (be.WritesBf16Sums()) {  // y in bf16: the f32 y rounded
          Tensor got16 = be.Empty(bc.shape, DType::kBF16, "y");
          be.AffineAdd(a0 != nullptr ? x16 : xw, a0, (which & 2) != 0 ? x16 : dy_a, a1, relu,
                       &got16);
          EXPECT_EQ(CountNotRounded(be, got16, want), 0)
              << "bf16 y, normalised " << which << (relu ? " relu" : "");
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, BatchNormTest, ::testing::ValuesIn(TestBackends()), BackendParamName);

// The CUDA backend's one-pass channels-last statistics (ew::BnShiftedMoments, shared code run here
// on the CPU): sums of x - shift and its square give the two-pass mean and variance within
// double rounding, also where the mean is 10^4 standard deviations from 0 (a naive one-pass sum of
// squares loses more than half of the variance's digits there).
TEST(BatchNormMomentsTest, ShiftedOnePassMatchesTwoPass) {
  for (const double mean : {0.0, 3.0, 1e4}) {
    std::vector<double> x(4096);
    uint32_t r = 7;
    for (double& v : x) {
      r = r * 1664525u + 1013904223u;
      v = mean + (static_cast<double>(r >> 8) / 16777216.0 - 0.5);
    }
    const double m = static_cast<double>(x.size());
    double sum = 0, sq = 0;
    for (double v : x) sum += v;
    const double ref_mean = sum / m;
    for (double v : x) sq += (v - ref_mean) * (v - ref_mean);
    const double ref_var = sq / m;
    const double shift = static_cast<float>(x[0]);  // the kernels widen an f32 (or bf16) value
    double s1 = 0, s2 = 0;
    for (double v : x) {
      s1 += v - shift;
      s2 += (v - shift) * (v - shift);
    }
    const ew::BnMoments mo = ew::BnShiftedMoments(shift, s1, s2, m);
    EXPECT_NEAR(mo.mean, ref_mean, 1e-12 * std::max(1.0, std::abs(ref_mean))) << mean;
    EXPECT_NEAR(mo.var, ref_var, 1e-9 * ref_var) << mean;
  }
  EXPECT_EQ(ew::BnShiftedMoments(2.0, 0.0, 0.0, 8.0).var, 0.0) << "a constant channel";
  EXPECT_EQ(ew::BnShiftedMoments(2.0, 1.0, 0.0, 1.0).var, 0.0) << "clamped, never negative";
}

}  // namespace
}  // namespace dptrain::testing
