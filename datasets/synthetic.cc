// SPDX-License-Identifier: Apache-2.0
// Synthetic datasets and the regression teacher (datasets/synthetic.h).
#include "datasets/synthetic.h"

#include <utility>

#include "core/util/rng.h"

namespace dptrain {

std::vector<float> TeacherWeights(int64_t features, uint64_t seed) {
  SplitMix64 rng(seed ^ 0x7EAC4E2ull);
  std::vector<float> w(static_cast<size_t>(features) + 1);
  for (auto& v : w) v = 2 * rng.NextFloat() - 1;
  return w;  // last entry: bias
}

std::unique_ptr<Dataset> MakeSynthetic(const Shape& sample, int64_t n, int64_t classes,
                                       bool regression, uint64_t seed) {
  const int64_t per = sample.numel();
  std::vector<float> images(static_cast<size_t>(n * per));
  std::vector<int32_t> labels(static_cast<size_t>(n), 0);
  SplitMix64 rng(seed);
  for (auto& v : images) v = regression ? 2 * rng.NextFloat() - 1 : rng.NextFloat();
  if (!regression) {
    // Labels from a random linear teacher over the pixels.
    std::vector<float> w(static_cast<size_t>(per * classes));
    SplitMix64 t(seed ^ 0xC1A55ull);
    for (auto& v : w) v = 2 * t.NextFloat() - 1;
    for (int64_t i = 0; i < n; ++i) {
      int32_t best = 0;
      double best_v = -1e300;
      for (int64_t c = 0; c < classes; ++c) {
        double s = 0;
        for (int64_t j = 0; j < per; ++j) {
          s += (images[static_cast<size_t>(i * per + j)] - 0.5f) *
               w[static_cast<size_t>(c * per + j)];
        }
        if (s > best_v) {
          best_v = s;
          best = static_cast<int32_t>(c);
        }
      }
      labels[static_cast<size_t>(i)] = best;
    }
  }
  return MakeMemoryDataset(std::move(images), std::move(labels), sample);
}

float TeacherTarget(const std::vector<float>& teacher, const float* x, int64_t features) {
  double s = teacher[static_cast<size_t>(features)];
  for (int64_t j = 0; j < features; ++j) {
    s += static_cast<double>(teacher[static_cast<size_t>(j)]) * x[j];
  }
  return static_cast<float>(s);
}

}  // namespace dptrain
