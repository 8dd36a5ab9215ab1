// SPDX-License-Identifier: Apache-2.0
// RandomResizedCrop's box sampling, the centre crop and the bilinear crop-resize (augment.h).
#include "datasets/augment.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace dptrain {

CropBox RandomResizedCropBox(int64_t height, int64_t width,
                             const std::function<double()>& uniform) {
  constexpr double kScaleLo = 0.08, kScaleHi = 1.0, kRatioLo = 3.0 / 4.0, kRatioHi = 4.0 / 3.0;
  // torch.log(torch.tensor(ratio)) is float32.
  const double log_lo = std::log(static_cast<float>(kRatioLo));
  const double log_hi = std::log(static_cast<float>(kRatioHi));
  const double lr_lo = static_cast<float>(log_lo), lr_hi = static_cast<float>(log_hi);
  const auto draw = [&](double a, double b) {
    return static_cast<double>(static_cast<float>(a + (b - a) * uniform()));
  };
  const auto randint = [&](int64_t n) {
    return std::min<int64_t>(static_cast<int64_t>(std::floor(uniform() * static_cast<double>(n))),
                             n - 1);
  };
  const double area = static_cast<double>(height * width);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * draw(kScaleLo, kScaleHi);
    const double aspect = static_cast<double>(std::exp(static_cast<float>(draw(lr_lo, lr_hi))));
    // Python's round(): half to even, as nearbyint in the default rounding mode.
    const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
    const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = randint(height - h + 1);
      const int64_t left = randint(width - w + 1);
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < kRatioLo) {
    h = static_cast<int64_t>(std::nearbyint(static_cast<double>(w) / kRatioLo));
  } else if (in_ratio > kRatioHi) {
    w = static_cast<int64_t>(std::nearbyint(static_cast<double>(h) * kRatioHi));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

CropBox CenterCropBox(int64_t height, int64_t width, int64_t size) {
  // torchvision: int(round((h - size) / 2.0)).
  const auto offset = [](int64_t n, int64_t s) {
    return static_cast<int64_t>(std::nearbyint(static_cast<double>(n - s) / 2.0));
  };
  return {offset(height, size), offset(width, size), size, size};
}

namespace {

// Input pixels as floats: a float as is, uint8 as x / 255 (Dataset::Read's conversion).
inline float Pixel(float v) { return v; }
inline float Pixel(uint8_t v) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = static_cast<float>(i) / 255.0f;
    return t;
  }();
  return table[v];
}

template <class T>
void CropResizeT(const T* in, int64_t c, int64_t h, int64_t w, const CropBox& box, int64_t out_h,
                 int64_t out_w, bool flip, float* out) {
  if (box.h == out_h && box.w == out_w) {
    // A box of the output's size (evaluation's centre crop): every bilinear weight would be 0,
    // and a + 0 * (b - a) is a, so a copy gives the same values without the taps.
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t y = 0; y < out_h; ++y) {
        const T* src = in + (ch * h + box.top + y) * w + box.left;
        float* dst = out + (ch * out_h + y) * out_w;
        if (flip) {
          for (int64_t x = 0; x < out_w; ++x) dst[x] = Pixel(src[out_w - 1 - x]);
        } else {
          for (int64_t x = 0; x < out_w; ++x) dst[x] = Pixel(src[x]);
        }
      }
    }
    return;
  }
  // Source coordinate of output pixel o along an axis of n box pixels resized to m:
  // (o + 0.5) * n / m - 0.5, clamped at 0 (align_corners = False), as two taps and a weight.
  struct Tap {
    int64_t i0, i1;
    float f;
  };
  const auto taps = [](int64_t n, int64_t m, int64_t origin) {
    std::vector<Tap> t(static_cast<size_t>(m));
    const double scale = static_cast<double>(n) / static_cast<double>(m);
    for (int64_t o = 0; o < m; ++o) {
      const double src = std::max(0.0, (static_cast<double>(o) + 0.5) * scale - 0.5);
      const auto i0 = std::min(static_cast<int64_t>(src), n - 1);
      const int64_t i1 = std::min(i0 + 1, n - 1);
      t[static_cast<size_t>(o)] = {origin + i0, origin + i1,
                                   static_cast<float>(src - static_cast<double>(i0))};
    }
    return t;
  };
  const std::vector<Tap> ty = taps(box.h, out_h, box.top);
  std::vector<Tap> tx = taps(box.w, out_w, box.left);
  if (flip) std::reverse(tx.begin(), tx.end());
  // Horizontal pass into a row buffer per needed source row, then the vertical blend.
  std::vector<float> r0(static_cast<size_t>(out_w)), r1(static_cast<size_t>(out_w));
  const auto row = [&](const T* src, std::vector<float>& dst) {
    for (size_t x = 0; x < tx.size(); ++x) {
      const Tap& t = tx[x];
      const float a = Pixel(src[t.i0]);
      dst[x] = a + t.f * (Pixel(src[t.i1]) - a);
    }
  };
  for (int64_t ch = 0; ch < c; ++ch) {
    const T* plane = in + ch * h * w;
    float* o = out + ch * out_h * out_w;
    int64_t have0 = -1, have1 = -1;
    for (int64_t y = 0; y < out_h; ++y) {
      const Tap& t = ty[static_cast<size_t>(y)];
      // Consecutive output rows share source rows: keep the two computed last.
      if (t.i0 != have0) {
        if (t.i0 == have1) {
          std::swap(r0, r1);
          have0 = have1;
          have1 = -1;
        } else {
          row(plane + t.i0 * w, r0);
          have0 = t.i0;
        }
      }
      if (t.i1 != have1) {
        if (t.i1 == have0) {
          r1 = r0;
        } else {
          row(plane + t.i1 * w, r1);
        }
        have1 = t.i1;
      }
      float* dst = o + y * out_w;
      for (int64_t x = 0; x < out_w; ++x) {
        const auto k = static_cast<size_t>(x);
        dst[x] = r0[k] + t.f * (r1[k] - r0[k]);
      }
    }
  }
}

}  // namespace

void CropResize(const float* in, int64_t c, int64_t h, int64_t w, const CropBox& box, int64_t out_h,
                int64_t out_w, bool flip, float* out) {
  CropResizeT(in, c, h, w, box, out_h, out_w, flip, out);
}

void CropResize(const uint8_t* in, int64_t c, int64_t h, int64_t w, const CropBox& box,
                int64_t out_h, int64_t out_w, bool flip, float* out) {
  CropResizeT(in, c, h, w, box, out_h, out_w, flip, out);
}

}  // namespace dptrain
