// SPDX-License-Identifier: Apache-2.0
// Every numerical tolerance the tests use, per compute precision: the only place they live.
// A backend result `got` matches the double reference `ref` when |got - ref| <= atol + rtol*|ref|
// (STYLE.md section 6); tests/testing/backends.h AllClose() applies it element by element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/backend.h"

namespace dptrain::testing {

struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
};

// Elementwise ops and short reductions computed in f32 (inputs exactly representable in f32, so
// the only error is the op's own rounding). Also used for several optimizer steps in f32.
inline constexpr Tolerance kF32Tol{1e-5, 1e-4};
// bf16 compute: 8 mantissa bits, relative rounding 2^-9 ~ 2e-3 per input and per output.
inline constexpr Tolerance kBF16Tol{2e-2, 2e-2};
// f16 compute: 11 mantissa bits, relative rounding 2^-12 ~ 2.4e-4.
inline constexpr Tolerance kF16Tol{5e-3, 5e-3};
// Results the backend contract says are accumulated in double (SumSquares): only summation order
// differs from the reference.
inline constexpr Tolerance kDoubleAccumTol{1e-9, 1e-9};
// Equality up to at most a couple of f32 ulps (copies, identity dropout, exact scalings).
inline constexpr Tolerance kExactTol{0.0, 2.5e-7};
// A whole model's forward and backward (or a few training steps) on two fp32 backends, or on one
// GPU vs several: every layer sums in its own order (cuDNN algorithms, GEMM blockings, allreduce
// order) and the differences compound through the layers.
inline constexpr Tolerance kCrossBackendTol{1e-4, 1e-3};
// A deep network's parameter gradients from a whole forward and backward on two fp32 backends,
// per tensor as ||got - ref||_2 / ||ref||_2. Elementwise they cannot be compared: a weight
// gradient sums batch*spatial terms that cancel to near zero on some elements, and at batch 8
// the batch norms make the early layers' gradients ill-conditioned. Measured on the CPU alone,
// inputs scaled by 1 +- 1e-6 move resnet50's gradients by 3.1% of their norm (resnet18 0.9%),
// and an H100 against the CPU backend differs by 2.8% (resnet50), 2.4% (resnet50_cifar), 1.2%
// (resnet18_cifar), 0.3% (resnet18), 1e-6 or less for the small models. Each op on its own is
// held to the op tolerances (cuda_model_test's EachNodeMatchesTheCpuBackend).
inline constexpr double kModelGradRelL2 = 5e-2;

// Base tolerance of one output element computed in `p`.
inline Tolerance ForPrecision(Precision p) {
  switch (p) {
    case Precision::kF32:
      return kF32Tol;
    case Precision::kBF16:
      return kBF16Tol;
    case Precision::kF16:
      return kF16Tol;
  }
  return kF32Tol;
}

// Tolerance of an output that is a sum of `terms` products of O(1) values (conv: C*R*S; conv
// backward data: K*R*S / stride^2; conv/linear weight gradients: the batch*spatial count;
// batch-norm statistics: N*H*W). Rounding errors of independent terms add like a random walk, so
// atol grows with sqrt(terms); rtol stays the precision's (the output itself grows as sqrt(terms)
// too, so relative error is roughly constant). Blocked/Winograd algorithms (oneDNN, cuDNN) stay
// well inside this.
inline Tolerance ForReduction(Precision p, int64_t terms) {
  Tolerance t = ForPrecision(p);
  t.atol *= std::sqrt(static_cast<double>(std::max<int64_t>(terms, 1)));
  return t;
}

// Statistical checks (dropout keep rate, ...): a count must lie within this many standard
// deviations of its expectation. With fixed seeds the outcome is deterministic; 5 sigma keeps a
// correct implementation passing for any seed with probability ~1 - 6e-7.
inline constexpr double kStatSigmas = 5.0;

// Gradient checks (central differences in double, STYLE.md section 6): step and pass criterion
// |analytic - numeric| <= kGradCheckTol * max(1, |analytic|, |numeric|).
inline constexpr double kGradCheckStep = 1e-3;
inline constexpr double kGradCheckTol = 1e-5;

}  // namespace dptrain::testing
