// SPDX-License-Identifier: Apache-2.0
// data.augment = "random-resized-crop" and data.crop: the crop boxes against torchvision's
// RandomResizedCrop.get_params on the same draws (the table below, from
// tests/integration/rrc_oracle.py, which ctest's integration.rrc_oracle reruns against this
// file), the bilinear crop-resize against PyTorch's formula, and the loader's output.
#include "datasets/augment.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "datasets/sampler.h"

namespace dptrain {
namespace {

struct BoxCase {
  int64_t h, w, k0;
  CropBox box;
};

// clang-format off
const BoxCase kTorchvision[] = {
    // BEGIN torchvision boxes
    {256, 256, 0, {29, 31, 222, 191}},
    {256, 256, 16, {34, 31, 211, 170}},
    {256, 256, 32, {38, 27, 196, 148}},
    {256, 256, 48, {64, 12, 133, 168}},
    {256, 256, 64, {57, 3, 115, 136}},
    {256, 256, 80, {49, 144, 90, 99}},
    {256, 256, 96, {2, 1, 245, 255}},
    {256, 256, 112, {1, 16, 239, 233}},
    {256, 256, 128, {24, 26, 232, 212}},
    {256, 256, 144, {29, 30, 222, 191}},
    {256, 256, 160, {34, 31, 210, 169}},
    {256, 256, 176, {38, 26, 196, 148}},
    {256, 256, 192, {64, 12, 133, 167}},
    {256, 256, 208, {57, 2, 114, 135}},
    {256, 256, 224, {49, 144, 89, 98}},
    {256, 256, 240, {2, 2, 245, 254}},
    {256, 256, 256, {1, 16, 239, 233}},
    {256, 256, 272, {24, 26, 231, 211}},
    {256, 256, 288, {29, 31, 222, 190}},
    {256, 256, 304, {34, 31, 210, 169}},
    {256, 256, 320, {38, 26, 195, 147}},
    {256, 256, 336, {64, 11, 132, 166}},
    {256, 256, 352, {57, 2, 114, 134}},
    {256, 256, 368, {49, 145, 88, 97}},
    {256, 256, 384, {2, 2, 245, 254}},
    {256, 341, 0, {47, 203, 112, 127}},
    {256, 341, 16, {10, 52, 243, 196}},
    {256, 341, 32, {19, 42, 226, 171}},
    {256, 341, 48, {53, 20, 154, 194}},
    {256, 341, 64, {50, 4, 133, 157}},
    {256, 341, 80, {45, 207, 103, 115}},
    {256, 341, 96, {50, 7, 136, 161}},
    {256, 341, 112, {46, 206, 108, 120}},
    {256, 341, 128, {51, 9, 138, 166}},
    {256, 341, 144, {0, 57, 256, 220}},
    {256, 341, 160, {10, 52, 243, 195}},
    {256, 341, 176, {19, 42, 226, 170}},
    {256, 341, 192, {53, 20, 153, 193}},
    {256, 341, 208, {50, 4, 132, 156}},
    {256, 341, 224, {45, 208, 102, 113}},
    {256, 341, 240, {51, 6, 135, 160}},
    {256, 341, 256, {46, 206, 107, 119}},
    {256, 341, 272, {51, 8, 138, 165}},
    {256, 341, 288, {0, 57, 256, 219}},
    {256, 341, 304, {11, 52, 242, 195}},
    {256, 341, 320, {19, 41, 225, 170}},
    {256, 341, 336, {53, 19, 153, 192}},
    {256, 341, 352, {50, 3, 131, 155}},
    {256, 341, 368, {45, 208, 101, 112}},
    {256, 341, 384, {51, 6, 134, 159}},
    {500, 375, 0, {106, 25, 376, 323}},
    {500, 375, 16, {107, 32, 356, 287}},
    {500, 375, 32, {106, 31, 332, 251}},
    {500, 375, 48, {143, 12, 225, 284}},
    {500, 375, 64, {124, 3, 195, 230}},
    {500, 375, 80, {103, 190, 152, 168}},
    {500, 375, 96, {127, 5, 199, 237}},
    {500, 375, 112, {106, 185, 158, 176}},
    {500, 375, 128, {104, 10, 392, 358}},
    {500, 375, 144, {106, 25, 376, 322}},
    {500, 375, 160, {107, 32, 356, 286}},
    {500, 375, 176, {106, 31, 331, 250}},
    {500, 375, 192, {142, 12, 225, 282}},
    {500, 375, 208, {124, 3, 194, 228}},
    {500, 375, 224, {103, 191, 150, 166}},
    {500, 375, 240, {126, 5, 198, 235}},
    {500, 375, 256, {105, 186, 156, 174}},
    {500, 375, 272, {105, 10, 391, 357}},
    {500, 375, 288, {106, 25, 375, 321}},
    {500, 375, 304, {107, 32, 355, 285}},
    {500, 375, 320, {106, 30, 330, 249}},
    {500, 375, 336, {142, 12, 224, 281}},
    {500, 375, 352, {124, 2, 192, 227}},
    {500, 375, 368, {102, 192, 149, 164}},
    {500, 375, 384, {126, 4, 197, 233}},
    {32, 32, 0, {4, 4, 28, 24}},
    {32, 32, 16, {5, 4, 26, 21}},
    {32, 32, 32, {5, 3, 25, 19}},
    {32, 32, 48, {8, 1, 17, 21}},
    {32, 32, 64, {7, 0, 14, 17}},
    {32, 32, 80, {6, 19, 11, 12}},
    {32, 32, 96, {0, 0, 31, 32}},
    {32, 32, 112, {0, 2, 30, 29}},
    {32, 32, 128, {3, 4, 29, 26}},
    {32, 32, 144, {4, 4, 28, 24}},
    {32, 32, 160, {5, 4, 26, 21}},
    {32, 32, 176, {5, 3, 24, 18}},
    {32, 32, 192, {8, 1, 17, 21}},
    {32, 32, 208, {7, 0, 14, 17}},
    {32, 32, 224, {6, 19, 11, 12}},
    {32, 32, 240, {0, 0, 31, 32}},
    {32, 32, 256, {0, 2, 30, 29}},
    {32, 32, 272, {3, 4, 29, 26}},
    {32, 32, 288, {4, 4, 28, 24}},
    {32, 32, 304, {5, 4, 26, 21}},
    {32, 32, 320, {5, 3, 24, 18}},
    {32, 32, 336, {8, 1, 17, 21}},
    {32, 32, 352, {7, 0, 14, 17}},
    {32, 32, 368, {6, 19, 11, 12}},
    {32, 32, 384, {0, 0, 31, 32}},
    {10, 200, 0, {0, 93, 10, 13}},
    {10, 200, 16, {0, 93, 10, 13}},
    {10, 200, 32, {0, 93, 10, 13}},
    {10, 200, 48, {0, 93, 10, 13}},
    {10, 200, 64, {0, 93, 10, 13}},
    {10, 200, 80, {0, 93, 10, 13}},
    {10, 200, 96, {0, 93, 10, 13}},
    {10, 200, 112, {0, 93, 10, 13}},
    {10, 200, 128, {0, 93, 10, 13}},
    {10, 200, 144, {0, 93, 10, 13}},
    {10, 200, 160, {0, 93, 10, 13}},
    {10, 200, 176, {0, 93, 10, 13}},
    {10, 200, 192, {0, 93, 10, 13}},
    {10, 200, 208, {0, 93, 10, 13}},
    {10, 200, 224, {0, 93, 10, 13}},
    {10, 200, 240, {0, 93, 10, 13}},
    {10, 200, 256, {0, 93, 10, 13}},
    {10, 200, 272, {0, 93, 10, 13}},
    {10, 200, 288, {0, 93, 10, 13}},
    {10, 200, 304, {0, 93, 10, 13}},
    {10, 200, 320, {0, 93, 10, 13}},
    {10, 200, 336, {0, 93, 10, 13}},
    {10, 200, 352, {0, 93, 10, 13}},
    {10, 200, 368, {0, 93, 10, 13}},
    {10, 200, 384, {0, 93, 10, 13}},
    {200, 12, 0, {92, 0, 16, 12}},
    {200, 12, 16, {92, 0, 16, 12}},
    {200, 12, 32, {92, 0, 16, 12}},
    {200, 12, 48, {92, 0, 16, 12}},
    {200, 12, 64, {92, 0, 16, 12}},
    {200, 12, 80, {92, 0, 16, 12}},
    {200, 12, 96, {92, 0, 16, 12}},
    {200, 12, 112, {92, 0, 16, 12}},
    {200, 12, 128, {92, 0, 16, 12}},
    {200, 12, 144, {92, 0, 16, 12}},
    {200, 12, 160, {92, 0, 16, 12}},
    {200, 12, 176, {92, 0, 16, 12}},
    {200, 12, 192, {92, 0, 16, 12}},
    {200, 12, 208, {92, 0, 16, 12}},
    {200, 12, 224, {92, 0, 16, 12}},
    {200, 12, 240, {92, 0, 16, 12}},
    {200, 12, 256, {92, 0, 16, 12}},
    {200, 12, 272, {92, 0, 16, 12}},
    {200, 12, 288, {92, 0, 16, 12}},
    {200, 12, 304, {92, 0, 16, 12}},
    {200, 12, 320, {92, 0, 16, 12}},
    {200, 12, 336, {92, 0, 16, 12}},
    {200, 12, 352, {92, 0, 16, 12}},
    {200, 12, 368, {92, 0, 16, 12}},
    {200, 12, 384, {92, 0, 16, 12}},
    {224, 224, 0, {25, 27, 195, 167}},
    {224, 224, 16, {30, 27, 184, 149}},
    {224, 224, 32, {33, 23, 172, 130}},
    {224, 224, 48, {56, 10, 117, 147}},
    {224, 224, 64, {50, 2, 101, 119}},
    {224, 224, 80, {43, 126, 78, 87}},
    {224, 224, 96, {1, 1, 215, 223}},
    {224, 224, 112, {1, 14, 209, 204}},
    {224, 224, 128, {21, 23, 203, 185}},
    {224, 224, 144, {26, 27, 194, 167}},
    {224, 224, 160, {30, 27, 184, 148}},
    {224, 224, 176, {33, 23, 171, 129}},
    {224, 224, 192, {56, 10, 116, 146}},
    {224, 224, 208, {50, 2, 100, 118}},
    {224, 224, 224, {43, 126, 78, 86}},
    {224, 224, 240, {2, 2, 214, 222}},
    {224, 224, 256, {1, 15, 209, 203}},
    {224, 224, 272, {22, 23, 202, 185}},
    {224, 224, 288, {26, 27, 194, 166}},
    {224, 224, 304, {30, 27, 184, 148}},
    {224, 224, 320, {33, 23, 171, 129}},
    {224, 224, 336, {55, 10, 116, 145}},
    {224, 224, 352, {50, 2, 100, 117}},
    {224, 224, 368, {43, 127, 77, 85}},
    {224, 224, 384, {1, 2, 214, 222}},
    {257, 300, 0, {14, 44, 241, 207}},
    {257, 300, 16, {21, 42, 229, 184}},
    {257, 300, 32, {28, 34, 213, 161}},
    {257, 300, 48, {59, 16, 144, 182}},
    {257, 300, 64, {54, 4, 125, 147}},
    {257, 300, 80, {47, 176, 97, 108}},
    {257, 300, 96, {55, 5, 127, 152}},
    {257, 300, 112, {48, 174, 101, 113}},
    {257, 300, 128, {6, 41, 251, 230}},
    {257, 300, 144, {14, 44, 241, 207}},
    {257, 300, 160, {22, 41, 228, 184}},
    {257, 300, 176, {28, 34, 212, 160}},
    {257, 300, 192, {58, 16, 144, 181}},
    {257, 300, 208, {54, 3, 124, 146}},
    {257, 300, 224, {47, 176, 96, 107}},
    {257, 300, 240, {54, 5, 127, 151}},
    {257, 300, 256, {48, 174, 100, 112}},
    {257, 300, 272, {6, 41, 251, 229}},
    {257, 300, 288, {14, 44, 241, 206}},
    {257, 300, 304, {22, 41, 228, 183}},
    {257, 300, 320, {28, 34, 212, 159}},
    {257, 300, 336, {59, 15, 143, 180}},
    {257, 300, 352, {54, 3, 123, 145}},
    {257, 300, 368, {47, 178, 95, 105}},
    {257, 300, 384, {54, 5, 126, 150}},
    // END torchvision boxes
};
// clang-format on

TEST(AugmentTest, CropBoxesAreTorchvisionsOnTheSameDraws) {
  constexpr double kPhi = 0.6180339887498949;
  for (const BoxCase& c : kTorchvision) {
    int64_t k = c.k0;
    const CropBox got = RandomResizedCropBox(c.h, c.w, [&] {
      const double x = static_cast<double>(++k) * kPhi;
      return x - std::floor(x);
    });
    EXPECT_EQ(got, c.box) << c.h << " x " << c.w << " from draw " << c.k0 << ": got {" << got.top
                          << ", " << got.left << ", " << got.h << ", " << got.w << "}";
  }
}

TEST(AugmentTest, CropResizeIsBilinearWithoutAlignCorners) {
  // One 4 x 6 plane; the box rows 1..3, columns 2..5 resized to 2 x 3 (downscale) and 6 x 8.
  std::vector<float> in(24);
  for (int i = 0; i < 24; ++i) in[static_cast<size_t>(i)] = static_cast<float>(i * i % 17);
  const CropBox box{1, 2, 3, 4};
  for (const auto& [oh, ow] : {std::pair<int64_t, int64_t>{2, 3}, {6, 8}, {3, 4}}) {
    for (bool flip : {false, true}) {
      std::vector<float> out(static_cast<size_t>(oh * ow));
      CropResize(in.data(), 1, 4, 6, box, oh, ow, flip, out.data());
      for (int64_t y = 0; y < oh; ++y) {
        for (int64_t x = 0; x < ow; ++x) {
          // F.interpolate(mode="bilinear", align_corners=False) on the box, then the flip.
          const auto src = [](int64_t o, int64_t n, int64_t m) {
            return std::max(0.0, (static_cast<double>(o) + 0.5) * static_cast<double>(n) /
                                         static_cast<double>(m) -
                                     0.5);
          };
          const double sy = src(y, box.h, oh), sx = src(flip ? ow - 1 - x : x, box.w, ow);
          const auto y0 = static_cast<int64_t>(sy), x0 = static_cast<int64_t>(sx);
          const int64_t y1 = std::min<int64_t>(y0 + 1, box.h - 1);
          const int64_t x1 = std::min<int64_t>(x0 + 1, box.w - 1);
          const auto at = [&](int64_t r, int64_t c) {
            return static_cast<double>(in[static_cast<size_t>((box.top + r) * 6 + box.left + c)]);
          };
          const double fy = sy - static_cast<double>(y0), fx = sx - static_cast<double>(x0);
          const double want = (1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x1)) +
                              fy * ((1 - fx) * at(y1, x0) + fx * at(y1, x1));
          EXPECT_NEAR(out[static_cast<size_t>(y * ow + x)], want, 1e-4)
              << oh << " x " << ow << (flip ? " flipped" : "") << " at " << y << ", " << x;
        }
      }
    }
  }
  // A box of the output's size is a copy.
  std::vector<float> out(12);
  CropResize(in.data(), 1, 4, 6, box, 3, 4, false, out.data());
  for (int64_t y = 0; y < 3; ++y) {
    for (int64_t x = 0; x < 4; ++x) {
      EXPECT_EQ(out[static_cast<size_t>(y * 4 + x)], in[static_cast<size_t>((1 + y) * 6 + 2 + x)]);
    }
  }
  // ... for every plane of stored uint8 pixels (x / 255), mirrored when flipped.
  std::vector<uint8_t> u8(size_t{2} * 24);
  for (size_t i = 0; i < u8.size(); ++i) u8[i] = static_cast<uint8_t>(i * 37 % 256);
  std::vector<float> planes(24);
  CropResize(u8.data(), 2, 4, 6, box, 3, 4, true, planes.data());
  for (int64_t ch = 0; ch < 2; ++ch) {
    for (int64_t y = 0; y < 3; ++y) {
      for (int64_t x = 0; x < 4; ++x) {
        const uint8_t v = u8[static_cast<size_t>((ch * 4 + 1 + y) * 6 + 2 + (3 - x))];
        EXPECT_EQ(planes[static_cast<size_t>((ch * 3 + y) * 4 + x)], static_cast<float>(v) / 255.0f)
            << ch << ", " << y << ", " << x;
      }
    }
  }
}

TEST(AugmentTest, CenterCropIsTorchvisions) {
  EXPECT_EQ(CenterCropBox(256, 256, 224), (CropBox{16, 16, 224, 224}));
  EXPECT_EQ(CenterCropBox(257, 300, 224), (CropBox{16, 38, 224, 224}));  // round(16.5) = 16
  EXPECT_EQ(CenterCropBox(259, 224, 224), (CropBox{18, 0, 224, 224}));   // round(17.5) = 18
}

// The loader's output: random-resized-crop to data.crop, the same for a sample on any number of
// ranks or threads (a function of seed, epoch and index), and evaluation's centre crop.
TEST(AugmentTest, LoaderCropsToDataCrop) {
  const int64_t n = 8, c = 3, h = 20, w = 24;
  std::vector<float> images(static_cast<size_t>(n * c * h * w));
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>(i % 251) / 251.f;
  std::vector<int32_t> labels(n, 0);
  auto ds = MakeMemoryDataset(images, labels, Shape{c, h, w});
  LoaderOptions o;
  o.augment = Augment::kRandomResizedCrop;
  o.crop = 16;
  o.seed = 5;
  EXPECT_EQ(LoaderOutputShape(o, Shape{c, h, w}), (Shape{c, 16, 16}));
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
  std::vector<float> a(images), b(images.begin() + 3 * c * h * w, images.begin() + 5 * c * h * w);
  TransformBatch(o, Shape{c, h, w}, 2, idx.data(), n, &a);
  ASSERT_EQ(a.size(), static_cast<size_t>(n * c * 16 * 16));
  // Samples 3 and 4 alone (another rank's or thread's batch) come out the same.
  TransformBatch(o, Shape{c, h, w}, 2, idx.data() + 3, 2, &b);
  for (size_t k = 0; k < b.size(); ++k) ASSERT_EQ(b[k], a[3 * c * 16 * 16 + k]);
  // Another epoch draws other boxes.
  std::vector<float> e(images);
  TransformBatch(o, Shape{c, h, w}, 3, idx.data(), n, &e);
  EXPECT_NE(e, a);
  // Evaluation (augment none) centre-crops.
  o.augment = Augment::kNone;
  const HostBatch ev = ReadRange(*ds, 1, 1, o);
  ASSERT_EQ(ev.images.size(), static_cast<size_t>(c * 16 * 16));
  const CropBox box = CenterCropBox(h, w, 16);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t y = 0; y < 16; ++y) {
      for (int64_t x = 0; x < 16; ++x) {
        ASSERT_EQ(ev.images[static_cast<size_t>((ch * 16 + y) * 16 + x)],
                  images[static_cast<size_t>(((1 * c + ch) * h + box.top + y) * w + box.left + x)]);
      }
    }
  }
  // A crop larger than the stored images, or with crop-flip, is a config error.
  o.crop = 21;
  EXPECT_THROW(ValidateLoaderOptions(o, Shape{c, h, w}), ConfigError);
  o.crop = 16;
  o.augment = Augment::kCropFlip;
  EXPECT_THROW(ValidateLoaderOptions(o, Shape{c, h, w}), ConfigError);
}

}  // namespace
}  // namespace dptrain
