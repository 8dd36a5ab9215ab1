// SPDX-License-Identifier: Apache-2.0
// Backend test helpers. Backend availability comes from the registry, so this file needs no
// DPTRAIN_HAS_CUDA branch of its own.
#include "tests/testing/backends.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "core/backend_registry.h"
#include "core/elementwise.h"
#include "core/error.h"

namespace dptrain::testing {

std::vector<std::string> TestBackends() { return BuiltBackends(); }

std::string BackendParamName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

Backend* BackendOrSkip(const std::string& name, std::string* why) {
  std::string reason;
  if (!BackendAvailable(name, &reason)) {
    // Registry reasons may or may not start with the backend's name; make sure the skip says it.
    if (reason.rfind(name, 0) != 0) reason = name + ": " + reason;
    if (why != nullptr) *why = reason;
    return nullptr;
  }
  return &GetBackend(name);
}

void BackendTest::SetUp() {
  std::string why;
  backend_ = BackendOrSkip(GetParam(), &why);
  if (backend_ == nullptr) GTEST_SKIP() << why;
}

// ---------------------------------------------------------------------------------------------
// copies

Tensor ToDevice(Backend& be, const std::vector<float>& values, const Shape& shape) {
  DPT_CHECK(shape.numel() == static_cast<int64_t>(values.size()))
      << values.size() << " values for shape " << shape.ToString();
  Tensor t = be.Empty(shape, DType::kF32, "test");
  if (!values.empty()) be.CopyFromHost(values.data(), &t);
  return t;
}

Tensor ToDevice(Backend& be, const std::vector<double>& values, const Shape& shape) {
  std::vector<float> f(values.size());
  for (size_t i = 0; i < values.size(); ++i) f[i] = static_cast<float>(values[i]);
  return ToDevice(be, f, shape);
}

Tensor ToDeviceI32(Backend& be, const std::vector<int32_t>& values, const Shape& shape) {
  DPT_CHECK(shape.numel() == static_cast<int64_t>(values.size()))
      << values.size() << " values for shape " << shape.ToString();
  Tensor t = be.Empty(shape, DType::kI32, "test");
  if (!values.empty()) be.CopyFromHost(values.data(), &t);
  return t;
}

std::vector<float> ToHost(Backend& be, const Tensor& t) {
  DPT_CHECK(t.dtype() == DType::kF32) << "ToHost wants f32, got " << DTypeName(t.dtype());
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) be.CopyToHost(t, out.data());
  return out;
}

Tensor ToDeviceBf16(Backend& be, const std::vector<float>& values, const Shape& shape) {
  DPT_CHECK(static_cast<int64_t>(values.size()) == shape.numel())
      << values.size() << " values for shape " << shape.ToString();
  std::vector<uint16_t> bits(values.size());
  std::transform(values.begin(), values.end(), bits.begin(), ew::FloatToBf16);
  Tensor t = be.Empty(shape, DType::kBF16, "test bf16 input");
  if (!bits.empty()) be.CopyFromHost(bits.data(), &t);
  return t;
}

int64_t CountNotRounded(Backend& be, const Tensor& bf16, const Tensor& f32) {
  DPT_CHECK(bf16.dtype() == DType::kBF16 && bf16.numel() == f32.numel())
      << DTypeName(bf16.dtype()) << " " << bf16.shape().ToString() << " against "
      << f32.shape().ToString();
  std::vector<uint16_t> got(static_cast<size_t>(bf16.numel()));
  if (!got.empty()) be.CopyToHost(bf16, got.data());
  const std::vector<float> want = ToHost(be, f32);
  int64_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) n += got[i] != ew::FloatToBf16(want[i]);
  return n;
}

double ScalarToHost(Backend& be, const Tensor& t) {
  DPT_CHECK(t.numel() == 1) << "scalar tensor has shape " << t.shape().ToString();
  if (t.dtype() == DType::kI32) {
    int32_t v = 0;
    be.CopyToHost(t, &v);
    return v;
  }
  DPT_CHECK(t.dtype() == DType::kF32) << "scalar dtype " << DTypeName(t.dtype());
  float v = 0.f;
  be.CopyToHost(t, &v);
  return v;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ---------------------------------------------------------------------------------------------
namespace {
// (N, C, H, W) values between NCHW and NHWC order, either way.
std::vector<float> Transpose(const std::vector<float>& from, const Shape& s, bool to_nhwc) {
  const int64_t c = s[1], hw = s[2] * s[3];
  std::vector<float> out(from.size());
  for (int64_t i = 0; i < s[0]; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      for (int64_t p = 0; p < hw; ++p) {
        const auto nchw = static_cast<size_t>((i * c + j) * hw + p);
        const auto nhwc = static_cast<size_t>((i * hw + p) * c + j);
        out[to_nhwc ? nhwc : nchw] = from[to_nhwc ? nchw : nhwc];
      }
    }
  }
  return out;
}
}  // namespace

std::vector<float> ToNhwc(const std::vector<float>& nchw, const Shape& s) {
  return Transpose(nchw, s, true);
}

std::vector<float> FromNhwc(const std::vector<float>& nhwc, const Shape& s) {
  return Transpose(nhwc, s, false);
}

Tensor InLayout(Backend& be, const std::vector<float>& nchw, const Shape& s, bool nhwc) {
  return ToDevice(be, nhwc ? ToNhwc(nchw, s) : nchw, s);
}
std::vector<float> ToHostNchw(Backend& be, const Tensor& t, bool nhwc) {
  return nhwc ? FromNhwc(ToHost(be, t), t.shape()) : ToHost(be, t);
}

// random data

std::vector<float> RandomUniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& v : out) v = dist(gen);
  return out;
}

std::vector<float> RandomDistinct(size_t n, uint32_t seed) {
  // The m = n rounded up to even odd multiples of 1/m, (2i + 1 - m) / m for i in [0, m): symmetric
  // about 0 and never 0, gaps 2/m; shuffled, then the first n.
  const size_t m = n + n % 2;
  const double dm = static_cast<double>(m);
  std::vector<float> out(m);
  for (size_t i = 0; i < m; ++i) {
    out[i] = static_cast<float>((2.0 * static_cast<double>(i) + 1.0 - dm) / dm);
  }
  std::mt19937 gen(seed);
  std::shuffle(out.begin(), out.end(), gen);
  out.resize(n);
  return out;
}

std::vector<int32_t> RandomLabels(size_t n, int32_t classes, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, classes - 1);
  std::vector<int32_t> out(n);
  for (int32_t& v : out) v = dist(gen);
  return out;
}

// ---------------------------------------------------------------------------------------------
// comparison

namespace {

template <class T>
::testing::AssertionResult AllCloseImpl(const std::vector<T>& got, const std::vector<double>& ref,
                                        double atol, double rtol) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure()
           << "size mismatch: got " << got.size() << " elements, reference " << ref.size();
  }
  if (got.empty()) return ::testing::AssertionSuccess() << "empty";
  size_t failures = 0;
  size_t worst = 0;
  double worst_ratio = -1.0;  // |diff| / allowed; a failing NaN/Inf counts as infinitely bad
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(static_cast<double>(got[i]) - ref[i]);
    const double allowed = atol + rtol * std::abs(ref[i]);
    const bool ok = diff <= allowed;  // false for NaN
    double ratio = 0.0;
    if (!ok) {
      ++failures;
      ratio = std::isfinite(diff) && allowed > 0.0 ? diff / allowed
                                                   : std::numeric_limits<double>::infinity();
    } else if (allowed > 0.0) {
      ratio = diff / allowed;
    }
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  std::ostringstream os;
  os << std::setprecision(9);
  const double g = static_cast<double>(got[worst]);
  os << "worst element [" << worst << "]: got " << g << ", ref " << ref[worst] << ", |diff| "
     << std::abs(g - ref[worst]) << ", allowed " << atol + rtol * std::abs(ref[worst]) << " (atol "
     << atol << ", rtol " << rtol << ")";
  if (failures == 0) return ::testing::AssertionSuccess() << os.str();
  return ::testing::AssertionFailure()
         << failures << " of " << got.size() << " elements differ; " << os.str();
}

}  // namespace

::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<double>& ref,
                                    double atol, double rtol) {
  return AllCloseImpl(got, ref, atol, rtol);
}

::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<double>& ref,
                                    const Tolerance& tol) {
  return AllCloseImpl(got, ref, tol.atol, tol.rtol);
}

::testing::AssertionResult AllClose(const std::vector<double>& got, const std::vector<double>& ref,
                                    const Tolerance& tol) {
  return AllCloseImpl(got, ref, tol.atol, tol.rtol);
}

::testing::AssertionResult Close(double got, double ref, const Tolerance& tol) {
  return AllCloseImpl(std::vector<double>{got}, std::vector<double>{ref}, tol.atol, tol.rtol);
}

}  // namespace dptrain::testing
