// SPDX-License-Identifier: Apache-2.0
// Optimizer updates on every built backend against the double reference over several steps:
// SGD (plain, momentum, Nesterov, weight decay, gradient scale) and AdamW (bias correction per
// step, decoupled weight decay), comparing parameters and optimizer state after every step.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/backend.h"
#include "tests/testing/backends.h"
#include "tests/testing/reference_ops.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

constexpr int kSteps = 6;
const std::vector<int64_t> kSizes = {1, 1009, 65537};

std::string Describe(const ew::SgdHyper& h) {
  return "lr=" + std::to_string(h.lr) + " momentum=" + std::to_string(h.momentum) +
         " wd=" + std::to_string(h.weight_decay) + " grad_scale=" + std::to_string(h.grad_scale) +
         (h.nesterov ? " nesterov" : "");
}

class OptimizerTest : public BackendTest {};

TEST_P(OptimizerTest, Sgd) {
  Backend& be = backend();
  const std::vector<ew::SgdHyper> configs = {
      {0.1f, 0.0f, 0.0f, 1.0f, false},     // plain
      {0.05f, 0.9f, 0.0f, 0.5f, false},    // momentum, scaled gradients
      {0.05f, 0.9f, 1e-2f, 1.0f, true},    // Nesterov + weight decay
      {0.01f, 0.9f, 5e-4f, 0.25f, false},  // momentum + weight decay
      {0.2f, 0.0f, 1e-1f, 1.0f, false},    // weight decay without momentum
  };
  uint32_t seed = 9000;
  for (const ew::SgdHyper& h : configs) {
    for (int64_t n : kSizes) {
      seed += 100;
      SCOPED_TRACE(Describe(h) + " n=" + std::to_string(n));
      const size_t un = static_cast<size_t>(n);
      const std::vector<float> p0 = RandomUniform(un, seed);
      Tensor param = ToDevice(be, p0, {n});
      Tensor buf = be.Zeros({n}, DType::kF32, "momentum");
      std::vector<double> ref_p = ToDouble(p0), ref_buf(un, 0.0);
      for (int step = 0; step < kSteps; ++step) {
        SCOPED_TRACE("step " + std::to_string(step + 1));
        const std::vector<float> g = RandomUniform(un, seed + 1 + static_cast<uint32_t>(step));
        be.SgdStep(h, &param, ToDevice(be, g, {n}), &buf);
        ref::SgdStep(h, &ref_p, ToDouble(g), &ref_buf);
        ASSERT_TRUE(AllClose(ToHost(be, param), ref_p, kF32Tol)) << "param";
        if (h.momentum != 0.0f) {
          ASSERT_TRUE(AllClose(ToHost(be, buf), ref_buf, kF32Tol)) << "momentum buffer";
        }
      }
    }
  }
}

TEST_P(OptimizerTest, AdamW) {
  Backend& be = backend();
  struct Config {
    float lr, beta1, beta2, eps, wd, grad_scale;
  };
  const std::vector<Config> configs = {
      {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f},   // Adam
      {1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f, 0.5f},  // AdamW defaults, scaled gradients
      {5e-2f, 0.8f, 0.99f, 1e-6f, 0.1f, 0.25f},   // strong decay
  };
  uint32_t seed = 9500;
  for (const Config& c : configs) {
    for (int64_t n : kSizes) {
      seed += 100;
      SCOPED_TRACE("lr=" + std::to_string(c.lr) + " wd=" + std::to_string(c.wd) +
                   " grad_scale=" + std::to_string(c.grad_scale) + " n=" + std::to_string(n));
      const size_t un = static_cast<size_t>(n);
      const std::vector<float> p0 = RandomUniform(un, seed);
      Tensor param = ToDevice(be, p0, {n});
      Tensor m = be.Zeros({n}, DType::kF32, "m");
      Tensor v = be.Zeros({n}, DType::kF32, "v");
      std::vector<double> ref_p = ToDouble(p0), ref_m(un, 0.0), ref_v(un, 0.0);
      for (int step = 1; step <= kSteps; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        // As the optimizer computes them: bias corrections for step t, handed over as floats.
        const ew::AdamWHyper h{c.lr,
                               c.beta1,
                               c.beta2,
                               c.eps,
                               c.wd,
                               c.grad_scale,
                               static_cast<float>(1.0 - std::pow(c.beta1, step)),
                               static_cast<float>(1.0 - std::pow(c.beta2, step))};
        const std::vector<float> g = RandomUniform(un, seed + static_cast<uint32_t>(step));
        be.AdamWStep(h, &param, ToDevice(be, g, {n}), &m, &v);
        ref::AdamWStep(h, &ref_p, ToDouble(g), &ref_m, &ref_v);
        ASSERT_TRUE(AllClose(ToHost(be, param), ref_p, kF32Tol)) << "param";
        ASSERT_TRUE(AllClose(ToHost(be, m), ref_m, kF32Tol)) << "m";
        ASSERT_TRUE(AllClose(ToHost(be, v), ref_v, kF32Tol)) << "v";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerTest, ::testing::ValuesIn(TestBackends()), BackendParamName);

}  // namespace
}  // namespace dptrain::testing
