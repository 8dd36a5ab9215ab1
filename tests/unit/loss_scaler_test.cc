// SPDX-License-Identifier: Apache-2.0
// Dynamic loss scaling: overflow halves and skips, growth after the interval, bounds, state.
#include "runtime/amp/loss_scaler.h"

#include <gtest/gtest.h>

namespace dptrain {
namespace {

TEST(LossScalerTest, DisabledNeverSkipsAndScalesByOne) {
  LossScaler s(false);
  EXPECT_EQ(s.scale(), 1.f);
  EXPECT_FALSE(s.Update(true));
}

TEST(LossScalerTest, OverflowSkipsAndHalves) {
  LossScaler s(true);
  EXPECT_EQ(s.scale(), 65536.f);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 32768.f);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 16384.f);
  EXPECT_EQ(s.state().skipped_steps, 2);
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 16384.f);
}

TEST(LossScalerTest, AtMinimumOnceHalvingCannotLowerTheScale) {
  LossScaler s(true, 4.0, 2000, 1.0);
  EXPECT_FALSE(s.at_minimum());
  EXPECT_TRUE(s.Update(true));  // 2
  EXPECT_FALSE(s.at_minimum());
  EXPECT_TRUE(s.Update(true));  // 1
  EXPECT_TRUE(s.at_minimum());
  EXPECT_TRUE(s.Update(true));  // stays 1
  EXPECT_EQ(s.scale(), 1.f);
  EXPECT_TRUE(s.at_minimum());
  EXPECT_FALSE(LossScaler(false).at_minimum());  // disabled: nothing to be at
}

TEST(LossScalerTest, GrowsAfterTheIntervalOfCleanSteps) {
  LossScaler s(true, 1024.0, 3);
  EXPECT_FALSE(s.Update(false));
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 1024.f);
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 2048.f);
  // An overflow resets the count.
  s.Update(false);
  s.Update(false);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 1024.f);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 1024.f);
  s.Update(false);
  EXPECT_EQ(s.scale(), 2048.f);
}

TEST(LossScalerTest, StaysWithinBoundsAndRestoresState) {
  LossScaler s(true, 2.0, 1, 1.0, 4.0);
  s.Update(true);
  s.Update(true);
  EXPECT_EQ(s.scale(), 1.f);
  s.Update(false);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 4.f);
  LossScaler t(true);
  t.set_state(s.state());
  EXPECT_EQ(t.scale(), 4.f);
  EXPECT_EQ(t.state().skipped_steps, 2);
}

}  // namespace
}  // namespace dptrain
