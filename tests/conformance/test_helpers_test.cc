// SPDX-License-Identifier: Apache-2.0
// The conformance helpers themselves: unavailable backends skip with a reason naming them,
// AllClose applies |got - ref| <= atol + rtol*|ref| and names the worst element, the random
// generators are deterministic and keep their promises.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "tests/testing/backends.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

TEST(TestHelpersTest, BackendListStartsWithCpu) {
  const std::vector<std::string> names = TestBackends();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "cpu");
}

TEST(TestHelpersTest, UnknownBackendGivesReasonNamingIt) {
  std::string why;
  EXPECT_EQ(BackendOrSkip("tpu", &why), nullptr);
  EXPECT_EQ(why.rfind("tpu: ", 0), 0u) << why;
  EXPECT_NE(BackendOrSkip("cpu", &why), nullptr);
}

TEST(TestHelpersTest, SkipMacroGivesAvailableBackend) {
  DPT_BACKEND_OR_SKIP(be, "cpu");  // an unknown name takes the path checked above
  EXPECT_EQ(be->name(), "cpu");
}

TEST(TestHelpersTest, AllCloseAppliesAtolPlusRtol) {
  EXPECT_TRUE(AllClose(std::vector<float>{1.0f, 2.0f}, {1.0, 2.0}, 0.0, 0.0));
  // |diff| = 0.5 <= 0.1 + 0.2 * 2 = 0.5 passes; 0.51 fails.
  EXPECT_TRUE(AllClose(std::vector<float>{2.5f}, {2.0}, 0.1, 0.2));
  EXPECT_FALSE(AllClose(std::vector<float>{2.51f}, {2.0}, 0.1, 0.2));
  EXPECT_FALSE(AllClose(std::vector<float>{1.0f}, {1.0, 2.0}, 1.0, 1.0)) << "size mismatch";
}

TEST(TestHelpersTest, AllCloseNamesWorstElementAndCountsNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const ::testing::AssertionResult r =
      AllClose(std::vector<float>{0.0f, 1.5f, 3.0f, nan}, {0.0, 1.0, 2.0, 4.0}, 1e-3, 0.0);
  ASSERT_FALSE(r);
  const std::string msg = r.message();
  EXPECT_NE(msg.find("3 of 4 elements differ"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3]"), std::string::npos) << "NaN is the worst element: " << msg;

  const ::testing::AssertionResult r2 =
      AllClose(std::vector<float>{0.0f, 1.5f, 3.0f}, {0.0, 1.0, 2.0}, 1e-3, 0.0);
  EXPECT_NE(std::string(r2.message()).find("worst element [2]: got 3, ref 2"), std::string::npos)
      << r2.message();
}

TEST(TestHelpersTest, ReductionToleranceGrowsWithSqrtTerms) {
  const Tolerance one = ForReduction(Precision::kF32, 1);
  const Tolerance hundred = ForReduction(Precision::kF32, 100);
  EXPECT_DOUBLE_EQ(hundred.atol, 10 * one.atol);
  EXPECT_DOUBLE_EQ(hundred.rtol, one.rtol);
  EXPECT_GT(ForPrecision(Precision::kBF16).rtol, ForPrecision(Precision::kF32).rtol);
}

TEST(TestHelpersTest, RandomDataIsDeterministic) {
  EXPECT_EQ(RandomUniform(100, 3), RandomUniform(100, 3));
  EXPECT_NE(RandomUniform(100, 3), RandomUniform(100, 4));
  for (float v : RandomUniform(1000, 5)) {
    EXPECT_GE(v, -1.0f);
    EXPECT_LE(v, 1.0f);
  }
  const std::vector<int32_t> labels = RandomLabels(1000, 7, 6);
  EXPECT_EQ(*std::min_element(labels.begin(), labels.end()), 0);
  EXPECT_EQ(*std::max_element(labels.begin(), labels.end()), 6);
}

TEST(TestHelpersTest, RandomDistinctHasGapsAndNoZero) {
  for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{1000}}) {
    std::vector<float> v = RandomDistinct(n, 9);
    ASSERT_EQ(v.size(), n);
    std::sort(v.begin(), v.end());
    const double step = 1.0 / static_cast<double>(n + 1);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_GT(v[i], -1.0f);
      EXPECT_LT(v[i], 1.0f);
      EXPECT_GE(std::abs(v[i]), 0.99 * step) << "too close to the ReLU kink";
      if (i > 0) {
        EXPECT_GE(v[i] - v[i - 1], 1.99 * step) << "too close to a tie";
      }
    }
  }
}

}  // namespace
}  // namespace dptrain::testing
