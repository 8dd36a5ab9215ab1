// SPDX-License-Identifier: Apache-2.0
// Test helpers for suites parameterised over the built backends: the backend list and name
// printer, skipping with the reason when a backend is unavailable or does not support a
// descriptor, host <-> backend copies, fixed-seed random data and the AllClose comparison.
//
// Typical suite:
//   class ConvTest : public BackendTest {};
//   TEST_P(ConvTest, Forward) {
//     Backend& be = backend();                      // SetUp() already skipped if unavailable
//     DPT_SKIP_UNLESS_SUPPORTED(be, desc);
//     Tensor x = ToDevice(be, xs, {n, c, h, w});
//     ...
//     EXPECT_TRUE(AllClose(ToHost(be, y), ref, ForReduction(desc.precision, terms)));
//   }
//   INSTANTIATE_TEST_SUITE_P(All, ConvTest, ::testing::ValuesIn(TestBackends()), BackendParamName);
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {

// The backends compiled into this binary (= BuiltBackends()): {"cpu"} or {"cpu", "cuda"}.
std::vector<std::string> TestBackends();

// gtest parameter-name generator: instantiated names end in /cpu, /cuda.
std::string BackendParamName(const ::testing::TestParamInfo<std::string>& info);

// The backend named `name`, or nullptr with `why` set ("cuda: no CUDA device (...)") when it
// cannot be used on this machine. Pair with GTEST_SKIP() (GTEST_SKIP only returns from the
// function it is written in, so the skip itself must be in the test; see the macro below).
Backend* BackendOrSkip(const std::string& name, std::string* why);

// In a TEST/TEST_P body: declares `Backend* var` or skips the test with the reason.
#define DPT_BACKEND_OR_SKIP(var, name)                                            \
  std::string var##_why_;                                                         \
  ::dptrain::Backend* var = ::dptrain::testing::BackendOrSkip(name, &var##_why_); \
  if (var == nullptr) GTEST_SKIP() << var##_why_

// Fixture for suites parameterised by backend name: SetUp() skips with the reason when the
// backend is not available (the test body does not run).
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;
  Backend& backend() { return *backend_; }

 private:
  Backend* backend_ = nullptr;
};

// Skips the current test unless `backend.Supports(desc)`, naming backend and descriptor.
#define DPT_SKIP_UNLESS_SUPPORTED(backend, desc) \
  if ((backend).Supports(desc)) {                \
  } else                                         \
    GTEST_SKIP() << (backend).name() << ": unsupported " << (desc).ToString()

// ---- host <-> backend copies (synchronous) ----
// f32 tensor of `shape` holding `values` (doubles are rounded to f32).
Tensor ToDevice(Backend& be, const std::vector<float>& values, const Shape& shape);
Tensor ToDevice(Backend& be, const std::vector<double>& values, const Shape& shape);
Tensor ToDeviceI32(Backend& be, const std::vector<int32_t>& values, const Shape& shape);
// An f32 tensor's contents (synchronises).
std::vector<float> ToHost(Backend& be, const Tensor& t);
// bf16 tensors: one holding `values` rounded to bf16 (ew::FloatToBf16), and how many elements of
// `bf16` differ from the rounded values of the f32 tensor `f32` (0: bit for bit).
Tensor ToDeviceBf16(Backend& be, const std::vector<float>& values, const Shape& shape);
int64_t CountNotRounded(Backend& be, const Tensor& bf16, const Tensor& f32);
// A 1-element tensor's value (f32 or i32) as double.
double ScalarToHost(Backend& be, const Tensor& t);
std::vector<double> ToDouble(const std::vector<float>& v);
// Values of an (N, C, H, W) tensor from NCHW order to channels-last (NHWC) order, and back: the
// inputs and outputs of the ops' nhwc variants (Conv2dDesc::x_nhwc) next to the NCHW reference.
std::vector<float> ToNhwc(const std::vector<float>& nchw, const Shape& s);
std::vector<float> FromNhwc(const std::vector<float>& nhwc, const Shape& s);
// NCHW values onto `be`, laid out NHWC when `nhwc`; and a tensor back as NCHW values.
Tensor InLayout(Backend& be, const std::vector<float>& nchw, const Shape& s, bool nhwc);
std::vector<float> ToHostNchw(Backend& be, const Tensor& t, bool nhwc);

// ---- fixed-seed random data (std::mt19937; the same on every run and platform) ----
// Uniform in [lo, hi], f32.
std::vector<float> RandomUniform(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f);
// n distinct values in (-1, 1), shuffled, pairwise at least 2/(n+1) apart and at least 1/(n+1)
// away from 0: inputs for ReLU (no kink at 0) and max pooling (no ties).
std::vector<float> RandomDistinct(size_t n, uint32_t seed);
// Labels uniform in [0, classes).
std::vector<int32_t> RandomLabels(size_t n, int32_t classes, uint32_t seed);

// ---- comparison: |got - ref| <= atol + rtol * |ref| for every element; on failure the message
// names the worst element (index, got, ref, |diff|, allowed) and how many elements fail. ----
::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<double>& ref,
                                    double atol, double rtol);
::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<double>& ref,
                                    const Tolerance& tol);
::testing::AssertionResult AllClose(const std::vector<double>& got, const std::vector<double>& ref,
                                    const Tolerance& tol);
// Scalar form.
::testing::AssertionResult Close(double got, double ref, const Tolerance& tol);

}  // namespace dptrain::testing
