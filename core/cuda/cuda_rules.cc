// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's pure rules (cuda_rules.h): descriptor limits, algorithm choice, device names.
#include "core/cuda/cuda_rules.h"

#include <algorithm>
#include <climits>
#include <cstdint>

namespace dptrain::cuda {

bool ConvFitsLegacyDescriptors(const Conv2dDesc& d) {
  if (!d.Valid()) return false;
  const auto fits = [](int64_t v) { return v >= 0 && v <= INT_MAX; };
  if (!(fits(d.n) && fits(d.c) && fits(d.h) && fits(d.w) && fits(d.k) && fits(d.r) && fits(d.s) &&
        fits(d.stride) && fits(d.pad) && fits(d.groups) && fits(d.dilation) &&
        fits(d.h + 2 * d.pad) && fits(d.w + 2 * d.pad))) {
    return false;
  }
  // Element counts in double: the products cannot overflow, and INT_MAX is far inside double's
  // exact range. The largest stride of a packed NCHW tensor (C*H*W) is below its count.
  const auto count = [](int64_t a, int64_t b, int64_t c, int64_t e) {
    return static_cast<double>(a) * static_cast<double>(b) * static_cast<double>(c) *
           static_cast<double>(e);
  };
  return count(d.n, d.c, d.h, d.w) <= INT_MAX && count(d.n, d.k, d.out_h(), d.out_w()) <= INT_MAX &&
         count(d.k, d.group_c(), d.r, d.s) <= INT_MAX;
}

std::optional<size_t> PickConvAlgo(const std::vector<AlgoCandidate>& perfs, bool fp32_strict,
                                   Determinism determinism, size_t cap, std::string* relaxed) {
  // Passes from strictest to loosest; each drops one more requirement, in the order of the
  // header comment. Determinism::kRequired never reaches the pass that drops determinism.
  struct Pass {
    bool capped, precise, fma_only, deterministic;
    const char* gave_up;
  };
  const bool want_det = determinism != Determinism::kAny;
  const Pass passes[] = {
      {true, true, true, want_det, ""},
      {false, true, true, want_det, "the workspace cap"},
      {false, false, true, want_det, "the workspace cap and a precise algorithm (FFT/Winograd)"},
      {false, false, false, want_det,
       "the workspace cap, a precise algorithm and FMA-only math (CUDNN_DEFAULT_MATH)"},
      {false, false, false, false,
       "the workspace cap, a precise algorithm, FMA-only math and determinism "
       "(train.deterministic = false)"},
  };
  const size_t n_passes = determinism == Determinism::kRequired ? 4 : 5;
  for (size_t pass = 0; pass < n_passes; ++pass) {
    const Pass& p = passes[pass];
    for (size_t i = 0; i < perfs.size(); ++i) {
      const AlgoCandidate& a = perfs[i];
      if (!a.ok) continue;
      if (fp32_strict) {
        // TF32 (tensor-op math) is never used for fp32: it changes the numerics the CPU backend
        // and the tests define.
        if (a.math == kCudnnTensorOpMath || a.math == kCudnnTensorOpMathAllowConversion) continue;
        if (p.fma_only && a.math != kCudnnFmaMath) continue;
      }
      if (p.precise && !a.precise) continue;
      if (p.deterministic && !a.deterministic) continue;
      if (p.capped && a.workspace > cap) continue;
      if (relaxed != nullptr) *relaxed = p.gave_up;
      return i;
    }
  }
  if (relaxed != nullptr) relaxed->clear();
  return std::nullopt;
}

int64_t BatchNormParts(int64_t n, int64_t c, int64_t hw) {
  constexpr int64_t kTargetBlocks = 512;
  if (n <= 0 || c <= 0) return 1;
  const int64_t by_blocks = (kTargetBlocks + c - 1) / c;
  const int64_t by_size = std::max<int64_t>(1, n * hw / 4096);
  return std::clamp<int64_t>(std::min(by_blocks, by_size), 1, n);
}

int64_t BatchNormNhwcParts(int64_t m, int64_t c) {
  constexpr int64_t kTargetBlocks = 1024, kMinRows = 64, kMaxParts = 65535;
  if (m <= 0 || c <= 0) return 1;
  const int64_t tiles = (c + 31) / 32;
  const int64_t by_blocks = (kTargetBlocks + tiles - 1) / tiles;
  const int64_t by_size = std::max<int64_t>(1, m / kMinRows);
  return std::clamp<int64_t>(std::min(by_blocks, by_size), 1, kMaxParts);
}

int64_t BatchNormNhwcScratch(int64_t m, int64_t c) {
  return 2 * c * (BatchNormNhwcParts(m, c) + 1);
}

std::string DeviceUuidString(const Uuid& device, const std::optional<Uuid>& gpu) {
  static const char* hex = "0123456789abcdef";
  std::string s = gpu.has_value() && *gpu != device ? "MIG-" : "GPU-";
  for (size_t i = 0; i < device.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[device[i] >> 4];
    s += hex[device[i] & 15];
  }
  return s;
}

}  // namespace dptrain::cuda
