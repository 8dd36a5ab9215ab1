// SPDX-License-Identifier: Apache-2.0
// Linear (y = x W^T + b) on every built backend against the double reference: forward, backward
// data, backward weights (overwrite and accumulate) with in/out of 1, odd and prime sizes, with
// and without bias, in f32, bf16 and f16.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/backend.h"
#include "tests/testing/backends.h"
#include "tests/testing/reference_ops.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

LinearDesc MakeLinear(int64_t n, int64_t in, int64_t out, bool bias,
                      Precision p = Precision::kF32) {
  LinearDesc d;
  d.n = n, d.in = in, d.out = out, d.bias = bias, d.precision = p;
  return d;
}

std::vector<LinearDesc> Cases(Precision p) {
  return {
      MakeLinear(1, 1, 1, true, p),       // everything 1
      MakeLinear(1, 7, 1, false, p),      // one output, no bias
      MakeLinear(3, 1, 5, true, p),       // one input
      MakeLinear(5, 13, 7, true, p),      // odd / prime
      MakeLinear(8, 64, 10, false, p),    // classifier head
      MakeLinear(2, 257, 3, true, p),     // long reduction
      MakeLinear(16, 100, 33, true, p),   // a batch
      MakeLinear(33, 31, 129, false, p),  // odd batch, wide output
  };
}

struct LinearData {
  std::vector<float> x, w, b;
};

LinearData MakeData(const LinearDesc& d, uint32_t seed) {
  return {RandomUniform(static_cast<size_t>(d.n * d.in), seed),
          RandomUniform(static_cast<size_t>(d.out * d.in), seed + 1),
          RandomUniform(static_cast<size_t>(d.out), seed + 2)};
}

void CheckForward(Backend& be, const LinearDesc& d, uint32_t seed) {
  SCOPED_TRACE(d.ToString());
  const LinearData data = MakeData(d, seed);
  auto plan = be.PrepareLinear(d);
  Tensor x = ToDevice(be, data.x, {d.n, d.in});
  Tensor w = ToDevice(be, data.w, {d.out, d.in});
  Tensor b = ToDevice(be, data.b, {d.out});
  Tensor y = be.Empty({d.n, d.out}, DType::kF32, "y");
  be.LinearForward(*plan, x, w, d.bias ? &b : nullptr, &y);

  std::vector<double> ref_y;
  const std::vector<double> ref_b = ToDouble(data.b);
  ref::LinearForward(d, ToDouble(data.x), ToDouble(data.w), d.bias ? &ref_b : nullptr, &ref_y);
  EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, ForReduction(d.precision, d.in + 1)));
}

void CheckBackwardData(Backend& be, const LinearDesc& d, uint32_t seed) {
  SCOPED_TRACE(d.ToString());
  const LinearData data = MakeData(d, seed);
  const std::vector<float> dy = RandomUniform(static_cast<size_t>(d.n * d.out), seed + 3);
  auto plan = be.PrepareLinear(d);
  Tensor dy_t = ToDevice(be, dy, {d.n, d.out});
  Tensor w = ToDevice(be, data.w, {d.out, d.in});
  Tensor dx = ToDevice(be, RandomUniform(static_cast<size_t>(d.n * d.in), 99), {d.n, d.in});
  be.LinearBackwardData(*plan, dy_t, w, &dx);

  std::vector<double> ref_dx;
  ref::LinearBackwardData(d, ToDouble(dy), ToDouble(data.w), &ref_dx);
  EXPECT_TRUE(AllClose(ToHost(be, dx), ref_dx, ForReduction(d.precision, d.out)));
}

void CheckBackwardWeights(Backend& be, const LinearDesc& d, uint32_t seed, bool accumulate) {
  SCOPED_TRACE(d.ToString() + (accumulate ? " accumulate" : " overwrite"));
  const LinearData data = MakeData(d, seed);
  const std::vector<float> dy = RandomUniform(static_cast<size_t>(d.n * d.out), seed + 3);
  const std::vector<float> dw0 = RandomUniform(static_cast<size_t>(d.out * d.in), seed + 4);
  const std::vector<float> db0 = RandomUniform(static_cast<size_t>(d.out), seed + 5);
  auto plan = be.PrepareLinear(d);
  Tensor x = ToDevice(be, data.x, {d.n, d.in});
  Tensor dy_t = ToDevice(be, dy, {d.n, d.out});
  Tensor dw = ToDevice(be, dw0, {d.out, d.in});
  Tensor db = ToDevice(be, db0, {d.out});
  be.LinearBackwardWeights(*plan, x, dy_t, &dw, d.bias ? &db : nullptr, accumulate);

  std::vector<double> ref_dw = ToDouble(dw0), ref_db = ToDouble(db0);
  ref::LinearBackwardWeights(d, ToDouble(data.x), ToDouble(dy), &ref_dw, d.bias ? &ref_db : nullptr,
                             accumulate);
  const Tolerance tol = ForReduction(d.precision, d.n + (accumulate ? 1 : 0));
  EXPECT_TRUE(AllClose(ToHost(be, dw), ref_dw, tol)) << "dw";
  if (d.bias) {
    EXPECT_TRUE(AllClose(ToHost(be, db), ref_db, tol)) << "db";
  } else {
    EXPECT_TRUE(AllClose(ToHost(be, db), ToDouble(db0), kExactTol)) << "db written without bias";
  }
}

class LinearTest : public BackendTest {
 protected:
  template <class F>
  void ForEachCase(Precision p, F check) {
    std::string unsupported;
    uint32_t seed = 2000;
    for (const LinearDesc& d : Cases(p)) {
      seed += 10;
      if (!backend().Supports(d)) {
        unsupported += " [" + d.ToString() + "]";
        continue;
      }
      check(d, seed);
    }
    if (!unsupported.empty()) GTEST_SKIP() << backend().name() << ": unsupported" << unsupported;
  }
};

TEST_P(LinearTest, Forward) {
  ForEachCase(Precision::kF32,
              [&](const LinearDesc& d, uint32_t s) { CheckForward(backend(), d, s); });
}

TEST_P(LinearTest, BackwardData) {
  ForEachCase(Precision::kF32,
              [&](const LinearDesc& d, uint32_t s) { CheckBackwardData(backend(), d, s); });
}

TEST_P(LinearTest, BackwardWeights) {
  ForEachCase(Precision::kF32, [&](const LinearDesc& d, uint32_t s) {
    CheckBackwardWeights(backend(), d, s, /*accumulate=*/false);
  });
}

TEST_P(LinearTest, BackwardWeightsAccumulate) {
  ForEachCase(Precision::kF32, [&](const LinearDesc& d, uint32_t s) {
    CheckBackwardWeights(backend(), d, s, /*accumulate=*/true);
  });
}

// Ops run on Batch() views of buffers sized for a larger batch (the last, partial batch of an
// epoch, with a plan prepared for that batch size).
TEST_P(LinearTest, SmallerBatchView) {
  Backend& be = backend();
  const LinearDesc big = MakeLinear(8, 5, 3, true);
  const LinearDesc small = MakeLinear(3, 5, 3, true);
  DPT_SKIP_UNLESS_SUPPORTED(be, small);
  const LinearData data = MakeData(big, 77);
  Tensor x = ToDevice(be, data.x, {big.n, big.in});
  Tensor w = ToDevice(be, data.w, {big.out, big.in});
  Tensor b = ToDevice(be, data.b, {big.out});
  Tensor y = be.Empty({big.n, big.out}, DType::kF32, "y");
  auto plan = be.PrepareLinear(small);
  Tensor ys = y.Batch(small.n);
  be.LinearForward(*plan, x.Batch(small.n), w, &b, &ys);

  std::vector<double> ref_y;
  const std::vector<double> ref_b = ToDouble(data.b);
  std::vector<double> xs = ToDouble(data.x);
  xs.resize(static_cast<size_t>(small.n * small.in));
  ref::LinearForward(small, xs, ToDouble(data.w), &ref_b, &ref_y);
  EXPECT_TRUE(AllClose(ToHost(be, ys), ref_y, ForReduction(Precision::kF32, small.in + 1)));
}

TEST_P(LinearTest, BF16Forward) {
  ForEachCase(Precision::kBF16,
              [&](const LinearDesc& d, uint32_t s) { CheckForward(backend(), d, s); });
}

TEST_P(LinearTest, BF16BackwardData) {
  ForEachCase(Precision::kBF16,
              [&](const LinearDesc& d, uint32_t s) { CheckBackwardData(backend(), d, s); });
}

TEST_P(LinearTest, BF16BackwardWeights) {
  ForEachCase(Precision::kBF16, [&](const LinearDesc& d, uint32_t s) {
    CheckBackwardWeights(backend(), d, s, /*accumulate=*/true);
  });
}

TEST_P(LinearTest, F16Forward) {
  ForEachCase(Precision::kF16,
              [&](const LinearDesc& d, uint32_t s) { CheckForward(backend(), d, s); });
}

TEST_P(LinearTest, F16BackwardData) {
  ForEachCase(Precision::kF16,
              [&](const LinearDesc& d, uint32_t s) { CheckBackwardData(backend(), d, s); });
}

TEST_P(LinearTest, F16BackwardWeights) {
  ForEachCase(Precision::kF16, [&](const LinearDesc& d, uint32_t s) {
    CheckBackwardWeights(backend(), d, s, /*accumulate=*/true);
  });
}

INSTANTIATE_TEST_SUITE_P(All, LinearTest, ::testing::ValuesIn(TestBackends()), BackendParamName);

}  // namespace
}  // namespace dptrain::testing
