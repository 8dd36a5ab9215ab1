// SPDX-License-Identifier: Apache-2.0
// Synthetic data (data.train / data.test = "synthetic"): deterministic from the seed, identical
// on every rank, so a run needs no file.
//  - regression (the `linear` model): x uniform in [-1, 1]^F; the target is a fixed teacher
//    y = w*.x + b* (TeacherWeights, TeacherTarget); the dataset's labels are unused (zero);
//  - classification: uniform pixels in [0, 1], labels from a fixed random linear teacher over the
//    pixels (learnable).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "datasets/dataset.h"

namespace dptrain {

// `n` samples of shape `sample` with labels in [0, classes) (classification) or zero labels
// (regression), generated in memory from `seed`.
std::unique_ptr<Dataset> MakeSynthetic(const Shape& sample, int64_t n, int64_t classes,
                                       bool regression, uint64_t seed);

// The regression teacher for samples of `features` values: `features` weights, then the bias.
std::vector<float> TeacherWeights(int64_t features, uint64_t seed);

// The teacher's target for one sample x[0..features): w*.x + b*, summed in double.
float TeacherTarget(const std::vector<float>& teacher, const float* x, int64_t features);

}  // namespace dptrain
