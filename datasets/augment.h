// SPDX-License-Identifier: Apache-2.0
// The image geometry of data.augment = "random-resized-crop" and data.crop: torchvision's
// RandomResizedCrop box sampling, the centre crop of evaluation, and the bilinear resize of a
// box to the output size. Pure functions on float CHW images; loader.cc draws the random numbers.
#pragma once

#include <cstdint>
#include <functional>

namespace dptrain {

// A crop box in pixels: rows [top, top + h), columns [left, left + w).
struct CropBox {
  int64_t top = 0, left = 0, h = 0, w = 0;
  bool operator==(const CropBox&) const = default;
};

// torchvision's RandomResizedCrop.get_params for an image of height x width, scale (0.08, 1)
// and ratio (3/4, 4/3): up to 10 attempts, each drawing a scale and a log aspect ratio (in
// float32, as torch's uniform_ on a float tensor) and, when the box fits, its top and left
// (torch.randint); otherwise the fallback centre crop clamped to the ratio range. `uniform`
// returns the next draw in [0, 1), consumed in torchvision's order: a uniform_(a, b) is
// float32(a + (b - a) * u) and randint(0, n) is floor(u * n).
CropBox RandomResizedCropBox(int64_t height, int64_t width, const std::function<double()>& uniform);

// The centre size x size box of an image (torchvision's CenterCrop offsets for size <= h, w).
CropBox CenterCropBox(int64_t height, int64_t width, int64_t size);

// Resizes `box` of each of the c planes of `in` (c x h x w) to out_h x out_w with bilinear
// interpolation (PyTorch's interpolate(mode="bilinear", align_corners=False) on the box, no
// antialiasing), mirrored left-right when `flip`. A box of the output's size is a plain copy.
void CropResize(const float* in, int64_t c, int64_t h, int64_t w, const CropBox& box, int64_t out_h,
                int64_t out_w, bool flip, float* out);
// The same from stored uint8 pixels, each read as x / 255 (as Dataset::Read gives them).
void CropResize(const uint8_t* in, int64_t c, int64_t h, int64_t w, const CropBox& box,
                int64_t out_h, int64_t out_w, bool flip, float* out);

}  // namespace dptrain
