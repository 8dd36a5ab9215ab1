// SPDX-License-Identifier: Apache-2.0
// The shared fp16 casts of core/elementwise.h (used by the CPU backend's fp16 mode and
// matching the CUDA kernels' __float2half_rn) against this CPU's F16C conversion instructions,
// on every fp16 value, every halfway point between neighbours (round to nearest even) and one
// float ulp either side of them, the overflow threshold, subnormals and NaN.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/elementwise.h"

namespace dptrain {
namespace {

__attribute__((target("f16c"))) uint16_t HardwareToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HardwareToFloat(uint16_t h) { return _cvtsh_ss(h); }

bool HaveF16c() { return __builtin_cpu_supports("f16c") != 0; }

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Same fp16 bits, except that any NaN may differ in payload (both must be NaN).
void ExpectSameHalf(float f) {
  const uint16_t got = ew::FloatToHalf(f), want = HardwareToHalf(f);
  if (std::isnan(f)) {
    EXPECT_EQ(got & 0x7c00u, 0x7c00u) << "NaN";
    EXPECT_NE(got & 0x3ffu, 0u) << "NaN";
    return;
  }
  EXPECT_EQ(got, want) << "f = " << f << " (bits 0x" << std::hex << Bits(f) << ")";
}

TEST(HalfCastTest, EveryHalfWidensExactly) {
  if (!HaveF16c()) GTEST_SKIP() << "this CPU has no F16C instructions to compare with";
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float want = HardwareToFloat(static_cast<uint16_t>(h));
    const float got = ew::HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(Bits(got), Bits(want)) << "half 0x" << std::hex << h;
    }
  }
}

TEST(HalfCastTest, NarrowingRoundsToNearestEvenLikeTheHardware) {
  if (!HaveF16c()) GTEST_SKIP() << "this CPU has no F16C instructions to compare with";
  for (uint32_t h = 0; h < 0x7c00u; ++h) {  // every finite positive half and its successor
    const float a = ew::HalfToFloat(static_cast<uint16_t>(h));
    const float b = h + 1 == 0x7c00u ? 65536.f : ew::HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = a + (b - a) / 2;  // exact in float
    for (float f :
         {a, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e30f), std::nextafter(a, 1e30f)}) {
      ExpectSameHalf(f);
      ExpectSameHalf(-f);
    }
  }
}

TEST(HalfCastTest, SpecialValues) {
  if (!HaveF16c()) GTEST_SKIP() << "this CPU has no F16C instructions to compare with";
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.f, -0.f, 65504.f, 65519.99f, 65520.f, 70000.f, 1e30f, inf, -inf,
                  std::numeric_limits<float>::quiet_NaN(), Bits(0x7f800001u), 5.96e-8f, 2.98e-8f,
                  2.9802322e-8f, 1e-10f, std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::max(), 6.1035156e-5f, 6.1e-5f}) {
    ExpectSameHalf(f);
    ExpectSameHalf(-f);
  }
  EXPECT_EQ(ew::RoundToHalf(65520.f), inf) << "fp16 overflow is what loss scaling detects";
  EXPECT_EQ(ew::RoundToHalf(65504.f), 65504.f);
  EXPECT_EQ(ew::RoundToHalf(1.f / 3), 0.333251953125f);
}

TEST(HalfCastTest, StridedSweepOfAllFloats) {
  if (!HaveF16c()) GTEST_SKIP() << "this CPU has no F16C instructions to compare with";
  for (uint64_t u = 0; u <= 0xffffffffull; u += 997) ExpectSameHalf(Bits(static_cast<uint32_t>(u)));
}

}  // namespace
}  // namespace dptrain
