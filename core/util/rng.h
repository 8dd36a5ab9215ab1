// SPDX-License-Identifier: Apache-2.0
// The one random generator of dptrain (header-only): SplitMix64 (Steele, Lea, Flood 2014) and
// its finaliser Mix64. Portable and bit-identical everywhere, unlike std:: distributions, so
// every random choice (initialisation, sample order, synthetic data) depends only on its seed.
#pragma once

#include <cstdint>

namespace dptrain {

// The SplitMix64 finaliser: a bijection on uint64 with good avalanche (counter-based hashing).
constexpr uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// SplitMix64: the state advances by the golden gamma; each output is Mix64 of the state.
class SplitMix64 {
 public:
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

  explicit SplitMix64(uint64_t state) : state_(state) {}

  uint64_t Next() { return Mix64(state_ += kGolden); }
  // Uniform in [0, 1) with 24 random bits (a float's mantissa).
  float NextFloat() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [0, 1) with 53 random bits (a double's mantissa).
  double NextDouble() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform in [0, bound), bound > 0, without modulo bias: rejects the low values that would
  // make some residues more likely.
  uint64_t Below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  uint64_t state_;
};

}  // namespace dptrain
