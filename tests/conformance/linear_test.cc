// SPDX-License-Identifier: Apache-2.0
// Linear (y = x W^T + b) on every built backend against the double reference: forward, backward
// data, backward weights (overwrite and accumulate) with in/out of 1, odd and prime sizes, with
// and without bias, in f32, bf16 and f16.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/elementwise.h"
#include "tests/testing/backends.h"
#include "tests/testing/reference_ops.h"
#include "tests/testing/tolerances.h"
#include "tests/testing/weighted_op_checks.h"

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

}  // namespace

// Linear plugged into the shared weighted-op checks (tests/testing/weighted_op_checks.h).
template <>
struct WeightedOp<LinearDesc> {
  using D = LinearDesc;
  static Shape X(const D& d) { return {d.n, d.in}; }
  static Shape W(const D& d) { return {d.out, d.in}; }
  static Shape Y(const D& d) { return {d.n, d.out}; }
  static int64_t Bias(const D& d) { return d.out; }
  static int64_t ForwardTerms(const D& d) { return d.in + 1; }
  static int64_t DataTerms(const D& d) { return d.out; }
  static int64_t WeightTerms(const D& d) { return d.n; }
  static std::shared_ptr<OpPlan> Prepare(Backend& be, const D& d) { return be.PrepareLinear(d); }
  static void Forward(Backend& be, const OpPlan& p, const Tensor& x, const Tensor& w,
                      const Tensor* b, Tensor* y) {
    be.LinearForward(p, x, w, b, y);
  }
  static void BackwardData(Backend& be, const OpPlan& p, const Tensor& dy, const Tensor& w,
                           Tensor* dx) {
    be.LinearBackwardData(p, dy, w, dx);
  }
  static void BackwardWeights(Backend& be, const OpPlan& p, const Tensor& x, const Tensor& dy,
                              Tensor* dw, Tensor* db, bool accumulate) {
    be.LinearBackwardWeights(p, x, dy, dw, db, accumulate);
  }
  static void Backward(Backend& be, const OpPlan& p, const Tensor& x, const Tensor& dy,
                       const Tensor& w, Tensor* dx, Tensor* dw, Tensor* db, bool accumulate) {
    be.LinearBackward(p, x, dy, w, dx, dw, db, accumulate);
  }
  static void RefForward(const D& d, const std::vector<double>& x, const std::vector<double>& w,
                         const std::vector<double>* b, std::vector<double>* y) {
    ref::LinearForward(d, x, w, b, y);
  }
  static void RefBackwardData(const D& d, const std::vector<double>& dy,
                              const std::vector<double>& w, std::vector<double>* dx) {
    ref::LinearBackwardData(d, dy, w, dx);
  }
  static void RefBackwardWeights(const D& d, const std::vector<double>& x,
                                 const std::vector<double>& dy, std::vector<double>* dw,
                                 std::vector<double>* db, bool accumulate) {
    ref::LinearBackwardWeights(d, x, dy, dw, db, accumulate);
  }
};

namespace {

class LinearTest : public BackendTest {
 protected:
  template <class F>
  void ForEachCase(Precision p, F check) {
    ForEachSupportedCase(backend(), Cases(p), 2000, check);
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

// LinearBackward against the two separate calls, in every precision.
TEST_P(LinearTest, BothBackwardPassesInOneCall) {
  for (const Precision prec : {Precision::kF32, Precision::kBF16, Precision::kF16}) {
    ForEachCase(prec,
                [&](const LinearDesc& d, uint32_t s) { CheckBothBackwardPasses(backend(), d, s); });
  }
}

// The same on two threads (tests run on one), where the CPU backend runs the two passes side by
// side, one matmul on each thread, each planned for one thread: the same bits as the separate
// calls (each on oneDNN's matmul planned for two threads), at ref_cnn's fc1 and a small shape.
TEST_P(LinearTest, BothBackwardPassesOnTwoThreads) {
  Backend& be = backend();
  be.SetThreads(2);
  for (const Precision prec : {Precision::kF32, Precision::kBF16, Precision::kF16}) {
    const std::vector<LinearDesc> cases = {MakeLinear(64, 3136, 128, true, prec),
                                           MakeLinear(5, 13, 7, true, prec)};
    ForEachSupportedCase(be, cases, 3000, [&](const LinearDesc& d, uint32_t s) {
      CheckBothBackwardPasses(be, d, s);
    });
  }
  be.SetThreads(1);
}

// Ops run on Batch() views of buffers sized for a larger batch (the last, partial batch of an
// epoch, with a plan prepared for that batch size).
TEST_P(LinearTest, SmallerBatchView) {
  Backend& be = backend();
  const LinearDesc big = MakeLinear(8, 5, 3, true);
  const LinearDesc small = MakeLinear(3, 5, 3, true);
  DPT_SKIP_UNLESS_SUPPORTED(be, small);
  const WeightedData data = MakeWeightedData(big, 77);
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

// bf16 rounds each operand to nearest, ties to even (ew::FloatToBf16), as PyTorch's bf16 does:
// with the other operand the identity, every output is one operand's rounded value exactly (its
// other products are zeros). 17 values a row: a vector of 16 and a tail; ties both ways, values
// just off them, one whose rounding carries into the exponent, and a tiny one.
TEST_P(LinearTest, BF16RoundsOperandsToNearestEven) {
  Backend& be = backend();
  constexpr int64_t kN = 17;
  const LinearDesc d = MakeLinear(kN, kN, kN, false, Precision::kBF16);
  DPT_SKIP_UNLESS_SUPPORTED(be, d);
  const float tie = 1.f + 0x1p-8f, odd_tie = 1.f + 3 * 0x1p-8f;
  const std::vector<float> pool = {tie,  -tie,   odd_tie,         -odd_tie, 1.f + 0x1p-9f,
                                   3.3f, -7.77f, 0x1.fffffep100f, 1e-20f,   1.f + 0x1.00002p-8f};
  std::vector<float> values(static_cast<size_t>(kN * kN)), eye(values.size(), 0.f);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = pool[i % pool.size()] * static_cast<float>(1 << (i % 3));
  for (int64_t i = 0; i < kN; ++i) eye[static_cast<size_t>(i * kN + i)] = 1.f;
  auto plan = be.PrepareLinear(d);
  const Shape sq{kN, kN};
  for (const bool x_side : {true, false}) {
    Tensor x = ToDevice(be, x_side ? values : eye, sq), w = ToDevice(be, x_side ? eye : values, sq),
           y = ToDevice(be, std::vector<float>(values.size()), sq);
    be.LinearForward(*plan, x, w, nullptr, &y);
    const std::vector<float> got = ToHost(be, y);
    int64_t wrong = 0;
    for (int64_t n = 0; n < kN; ++n) {
      for (int64_t o = 0; o < kN; ++o) {
        // y[n][o] = x[n][o] (W = I) or W[o][n] (x = I).
        const float v = values[static_cast<size_t>(x_side ? n * kN + o : o * kN + n)];
        const float want = ew::Bf16ToFloat(ew::FloatToBf16(v));
        const float have = got[static_cast<size_t>(n * kN + o)];
        wrong += have != want;
      }
    }
    EXPECT_EQ(wrong, 0) << (x_side ? "x" : "W") << " rounded otherwise than to nearest even";
  }
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
