// SPDX-License-Identifier: Apache-2.0
// Host-returning checks on every built backend: CountNonFinite with NaN / +Inf / -Inf planted at
// the edges and in the middle (largest finite values and subnormals are finite), and SumSquares
// (accumulated in double by contract) against the double reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/backend.h"
#include "tests/testing/backends.h"
#include "tests/testing/reference_ops.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

const std::vector<int64_t> kSizes = {1, 2, 1009, 65537, 1000003};

class ChecksTest : public BackendTest {};

TEST_P(ChecksTest, CountNonFiniteClean) {
  Backend& be = backend();
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> x = RandomUniform(static_cast<size_t>(n), 61, -1e3f, 1e3f);
    // Finite extremes must not count.
    x[0] = std::numeric_limits<float>::max();
    x.back() = -std::numeric_limits<float>::denorm_min();
    EXPECT_EQ(be.CountNonFinite(ToDevice(be, x, {n})), 0);
  }
}

TEST_P(ChecksTest, CountNonFinitePlanted) {
  Backend& be = backend();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> x = RandomUniform(static_cast<size_t>(n), 62);
    const size_t last = x.size() - 1;
    x[last] = nan;
    if (n >= 2) x[0] = inf;
    if (n >= 1009) {
      x[n / 2] = -inf;
      x[n / 3] = -nan;
      x[n / 2 + 1] = std::numeric_limits<float>::signaling_NaN();
      x[n / 5] = std::numeric_limits<float>::lowest();  // finite
    }
    const int64_t want = ref::CountNonFinite(x);
    ASSERT_EQ(want, n >= 1009 ? 5 : (n >= 2 ? 2 : 1));
    EXPECT_EQ(be.CountNonFinite(ToDevice(be, x, {n})), want);
  }
}

TEST_P(ChecksTest, CountNonFiniteAllBad) {
  Backend& be = backend();
  const int64_t n = 4099;
  std::vector<float> x(static_cast<size_t>(n), std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < x.size(); i += 2) x[i] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(be.CountNonFinite(ToDevice(be, x, {n})), n);
}

TEST_P(ChecksTest, SumSquares) {
  Backend& be = backend();
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> x = RandomUniform(static_cast<size_t>(n), 63);
    EXPECT_TRUE(
        Close(be.SumSquares(ToDevice(be, x, {n})), ref::SumSquares(ToDouble(x)), kDoubleAccumTol));
  }
}

// Values whose squares span many orders of magnitude: an f32 accumulator would lose the small
// ones entirely (1e6 + 1e-6 * many); the contract asks for a double sum.
TEST_P(ChecksTest, SumSquaresWideRange) {
  Backend& be = backend();
  const int64_t n = 100003;
  std::vector<float> x = RandomUniform(static_cast<size_t>(n), 64, -1e-3f, 1e-3f);
  x[7] = 1e3f;
  x[n - 1] = -2e3f;
  EXPECT_TRUE(
      Close(be.SumSquares(ToDevice(be, x, {n})), ref::SumSquares(ToDouble(x)), kDoubleAccumTol));
}

INSTANTIATE_TEST_SUITE_P(All, ChecksTest, ::testing::ValuesIn(TestBackends()), BackendParamName);

}  // namespace
}  // namespace dptrain::testing
