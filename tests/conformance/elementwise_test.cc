// SPDX-License-Identifier: Apache-2.0
// Elementwise ops on every built backend against the double reference: ReLU and the other
// activations (clip, sigmoid, hard sigmoid, hard swish, tanh) forward/backward
// (inputs away from the kink), Add (including aliased outputs), CopyColumns, Scale, the NCHW <->
// NHWC layout changes, and inverted
// dropout (p = 0 is the identity, the mask matches the shared stateless hash, keep-rate
// statistics).
#include "core/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "tests/testing/backends.h"
#include "tests/testing/reference_ops.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

// Sizes: 1, odd, prime, and one large enough to be split across threads / blocks.
const std::vector<int64_t> kSizes = {1, 7, 1009, 65537};

class ElementwiseTest : public BackendTest {};

TEST_P(ElementwiseTest, ReluForwardBackward) {
  Backend& be = backend();
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> x = RandomDistinct(static_cast<size_t>(n), 11);
    const std::vector<float> dy = RandomUniform(static_cast<size_t>(n), 12);
    Tensor x_t = ToDevice(be, x, {n});
    Tensor y = be.Empty({n}, DType::kF32, "y");
    be.ReluForward(x_t, &y);
    std::vector<double> ref_y, ref_dx;
    ref::ReluForward(ToDouble(x), &ref_y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, kExactTol)) << "forward";

    Tensor dy_t = ToDevice(be, dy, {n});
    Tensor dx = be.Empty({n}, DType::kF32, "dx");
    be.ReluBackward(y, dy_t, &dx);
    ref::ReluBackward(ref_y, ToDouble(dy), &ref_dx);
    EXPECT_TRUE(AllClose(ToHost(be, dx), ref_dx, kExactTol)) << "backward";
  }
}

// A gradient in two parts (Backend::TakesGradientParts): ReluBackwardSum gives the bits of Add
// then ReluBackward, into another tensor and over y (as a residual sum's folded ReLU writes it).
TEST_P(ElementwiseTest, ReluBackwardOfAGradientInTwoPartsIsOfTheirSum) {
  Backend& be = backend();
  if (!be.TakesGradientParts()) GTEST_SKIP() << be.name() << ": sums gradient parts first";
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> y = RandomUniform(static_cast<size_t>(n), 16);
    for (size_t i = 0; i < y.size(); i += 3) y[i] = 0.f;  // ReLU outputs: zeros among them
    for (float& v : y) v = std::max(v, 0.f);
    const std::vector<float> a = RandomUniform(static_cast<size_t>(n), 17);
    const std::vector<float> b = RandomUniform(static_cast<size_t>(n), 18);
    Tensor y_t = ToDevice(be, y, {n}), a_t = ToDevice(be, a, {n}), b_t = ToDevice(be, b, {n});
    Tensor sum = be.Empty({n}, DType::kF32, "sum"), want = be.Empty({n}, DType::kF32, "want");
    be.Add(a_t, b_t, &sum);
    be.ReluBackward(y_t, sum, &want);
    Tensor dx = be.Empty({n}, DType::kF32, "dx");
    be.ReluBackwardSum(y_t, a_t, b_t, 1, &dx);
    EXPECT_EQ(ToHost(be, dx), ToHost(be, want));
    be.ReluBackwardSum(y_t, a_t, b_t, 1, &y_t);
    EXPECT_EQ(ToHost(be, y_t), ToHost(be, want)) << "over y";
  }
}

// A bf16 y (Backend::WritesBf16Sums: a residual sum that only bf16 convolutions read): the ReLU's
// backward, in one part and two, gives the bits of the same op on the rounded y widened to f32,
// whose zeros are the f32 y's.
TEST_P(ElementwiseTest, ReluBackwardOfABf16OutputIsOfItsValues) {
  Backend& be = backend();
  if (!be.WritesBf16Sums()) GTEST_SKIP() << be.name() << ": writes no bf16 sums";
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> y = RandomUniform(static_cast<size_t>(n), 26);
    for (size_t i = 0; i < y.size(); i += 3) y[i] = 0.f;
    for (float& v : y) v = std::max(v, 0.f);
    Tensor y16 = ToDeviceBf16(be, y, {n});
    std::vector<uint16_t> bits(y.size());
    be.CopyToHost(y16, bits.data());
    std::vector<float> wide(y.size());
    for (size_t i = 0; i < y.size(); ++i) wide[i] = ew::Bf16ToFloat(bits[i]);
    Tensor yw = ToDevice(be, wide, {n});
    Tensor a_t = ToDevice(be, RandomUniform(static_cast<size_t>(n), 27), {n});
    Tensor b_t = ToDevice(be, RandomUniform(static_cast<size_t>(n), 28), {n});
    Tensor want = be.Empty({n}, DType::kF32, "want"), got = be.Empty({n}, DType::kF32, "got");
    be.ReluBackward(yw, a_t, &want);
    be.ReluBackward(y16, a_t, &got);
    EXPECT_EQ(ToHost(be, got), ToHost(be, want)) << "one part";
    be.ReluBackwardSum(yw, a_t, b_t, 1, &want);
    be.ReluBackwardSum(y16, a_t, b_t, 1, &got);
    EXPECT_EQ(ToHost(be, got), ToHost(be, want)) << "two parts";
  }
}

// A strided shortcut's sampled input gradient as the second part (Conv2dDesc::dx_sub; b_stride):
// the bits of that part spread over the whole gradient with zeros between, channels-last, into
// another tensor and over an f32 y, and by a bf16 y. A -0 in the first part where the second holds
// nothing sums to +0, as it does with the zeros.
TEST_P(ElementwiseTest, ReluBackwardOfASampledPartIsOfItSpread) {
  Backend& be = backend();
  if (!be.TakesGradientParts()) GTEST_SKIP() << be.name() << ": sums gradient parts first";
  struct Case {
    int64_t n, c, h, w, s;
  };
  const auto bits = [](const std::vector<float>& v) {
    std::vector<uint32_t> out(v.size());
    std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
    return out;
  };
  uint32_t seed = 40;
  for (const Case& k : {Case{2, 16, 8, 8, 2}, Case{3, 3, 12, 6, 3}, Case{4, 32, 32, 32, 2}}) {
    SCOPED_TRACE("stride " + std::to_string(k.s) + ", c " + std::to_string(k.c));
    const Shape whole{k.n, k.c, k.h, k.w}, sampled{k.n, k.c, k.h / k.s, k.w / k.s};
    std::vector<float> y = RandomUniform(static_cast<size_t>(whole.numel()), ++seed);
    for (size_t i = 0; i < y.size(); i += 3) y[i] = 0.f;
    for (float& v : y) v = std::max(v, 0.f);
    std::vector<float> a = RandomUniform(static_cast<size_t>(whole.numel()), ++seed);
    const auto unsampled = static_cast<size_t>(k.c + 1);  // pixel (0, 0, 1): between samples
    a[unsampled] = -0.f;
    y[unsampled] = 1.f;
    const std::vector<float> b = RandomUniform(static_cast<size_t>(sampled.numel()), ++seed);
    std::vector<float> spread(a.size(), 0.f);  // channels-last
    for (int64_t n = 0; n < k.n; ++n) {
      for (int64_t i = 0; i < k.h / k.s; ++i) {
        for (int64_t j = 0; j < k.w / k.s; ++j) {
          for (int64_t c = 0; c < k.c; ++c) {
            spread[static_cast<size_t>(((n * k.h + i * k.s) * k.w + j * k.s) * k.c + c)] =
                b[static_cast<size_t>(((n * (k.h / k.s) + i) * (k.w / k.s) + j) * k.c + c)];
          }
        }
      }
    }
    Tensor a_t = ToDevice(be, a, whole), b_t = ToDevice(be, b, sampled),
           spread_t = ToDevice(be, spread, whole);
    for (const bool bf16 : {false, true}) {
      if (bf16 && !be.WritesBf16Sums()) continue;
      SCOPED_TRACE(bf16 ? "bf16 y" : "f32 y");
      Tensor y_t = bf16 ? ToDeviceBf16(be, y, whole) : ToDevice(be, y, whole);
      Tensor want = be.Empty(whole, DType::kF32, "want"), got = be.Empty(whole, DType::kF32, "got");
      be.ReluBackwardSum(y_t, a_t, spread_t, 1, &want);
      be.ReluBackwardSum(y_t, a_t, b_t, k.s, &got);
      const std::vector<float> w = ToHost(be, want);
      EXPECT_EQ(bits(ToHost(be, got)), bits(w));
      EXPECT_EQ(bits({w[unsampled]}), bits({0.f})) << "-0 + 0";
      if (!bf16) {
        be.ReluBackwardSum(y_t, a_t, b_t, k.s, &y_t);
        EXPECT_EQ(bits(ToHost(be, y_t)), bits(w)) << "over y";
      }
    }
  }
}

// Every activation, forward and backward, against the double reference (PyTorch's definitions)
// on inputs spread over [-8, 8]: both sides of each kink, and saturated sigmoid/tanh.
TEST_P(ElementwiseTest, ActivationsForwardBackward) {
  Backend& be = backend();
  for (const auto& c : ref::ActivationCases()) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(std::string(c.name) + " n=" + std::to_string(n));
      std::vector<float> x = RandomDistinct(static_cast<size_t>(n), 14);
      for (float& v : x) v *= 8.f;
      const std::vector<float> dy = RandomUniform(static_cast<size_t>(n), 15);
      Tensor x_t = ToDevice(be, x, {n});
      Tensor y = be.Empty({n}, DType::kF32, "y");
      be.ActivationForward(c.f, x_t, &y);
      std::vector<double> ref_y, ref_dx;
      ref::ActivationForward(c.f, ToDouble(x), &ref_y);
      const Tolerance tol = ForPrecision(Precision::kF32);
      EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, tol)) << "forward";

      Tensor dy_t = ToDevice(be, dy, {n});
      Tensor dx = be.Empty({n}, DType::kF32, "dx");
      be.ActivationBackward(c.f, x_t, y, dy_t, &dx);
      ref::ActivationBackward(c.f, ToDouble(x), ToDouble(dy), &ref_dx);
      EXPECT_TRUE(AllClose(ToHost(be, dx), ref_dx, tol)) << "backward";
    }
  }
}

// The channel scaling of squeeze-and-excitation blocks and its gradient: rows of 1 (the
// elementwise product), 7 and 3136 (56x56) columns.
TEST_P(ElementwiseTest, MulRowsAndRowDot) {
  Backend& be = backend();
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1009, 1}, {2 * 24, 7}, {2 * 16, 3136}, {1, 65537}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const std::vector<float> x = RandomUniform(static_cast<size_t>(rows * cols), 16);
    const std::vector<float> s = RandomUniform(static_cast<size_t>(rows), 17);
    const std::vector<float> dy = RandomUniform(static_cast<size_t>(rows * cols), 18);
    Tensor x_t = ToDevice(be, x, {rows * cols});
    Tensor s_t = ToDevice(be, s, {rows});
    Tensor y = be.Empty({rows * cols}, DType::kF32, "y");
    be.MulRows(x_t, s_t, &y);
    std::vector<double> ref_y, ref_ds;
    ref::MulRows(ToDouble(x), ToDouble(s), &ref_y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, ForPrecision(Precision::kF32))) << "mul_rows";

    Tensor dy_t = ToDevice(be, dy, {rows * cols});
    Tensor ds = be.Empty({rows}, DType::kF32, "ds");
    be.RowDot(dy_t, x_t, &ds);
    ref::RowDot(ToDouble(dy), ToDouble(x), rows, &ref_ds);
    EXPECT_TRUE(AllClose(ToHost(be, ds), ref_ds, ForReduction(Precision::kF32, cols))) << "row_dot";

    be.MulRows(x_t, s_t, &x_t);  // y aliases x
    EXPECT_TRUE(AllClose(ToHost(be, x_t), ref_y, ForPrecision(Precision::kF32))) << "aliased";
  }
}

// The per-channel shift (a (N, C, 1, 1) tensor added to (N, C, H, W)) and its gradient.
TEST_P(ElementwiseTest, AddRowsAndRowSum) {
  Backend& be = backend();
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1009, 1}, {2 * 24, 7}, {2 * 16, 3136}, {1, 65537}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const std::vector<float> x = RandomUniform(static_cast<size_t>(rows * cols), 26);
    const std::vector<float> s = RandomUniform(static_cast<size_t>(rows), 27);
    const std::vector<float> dy = RandomUniform(static_cast<size_t>(rows * cols), 28);
    Tensor x_t = ToDevice(be, x, {rows * cols});
    Tensor s_t = ToDevice(be, s, {rows});
    Tensor y = be.Empty({rows * cols}, DType::kF32, "y");
    be.AddRows(x_t, s_t, &y);
    std::vector<double> ref_y, ref_ds;
    ref::AddRows(ToDouble(x), ToDouble(s), &ref_y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, ForPrecision(Precision::kF32))) << "add_rows";

    Tensor dy_t = ToDevice(be, dy, {rows * cols});
    Tensor ds = be.Empty({rows}, DType::kF32, "ds");
    be.RowSum(dy_t, &ds);
    ref::RowDot(ToDouble(dy), std::vector<double>(x.size(), 1.0), rows, &ref_ds);
    EXPECT_TRUE(AllClose(ToHost(be, ds), ref_ds, ForReduction(Precision::kF32, cols))) << "row_sum";

    be.AddRows(x_t, s_t, &x_t);  // y aliases x
    EXPECT_TRUE(AllClose(ToHost(be, x_t), ref_y, ForPrecision(Precision::kF32))) << "aliased";
  }
}

// Zero padding on each side, asymmetric, and cropping (negative amounts: the gradient of a
// padding); the values are copied, so exact.
TEST_P(ElementwiseTest, Pad2dPadsAndCrops) {
  Backend& be = backend();
  struct Case {
    int64_t n, c, h, w, top, left, bottom, right;
  };
  for (const Case& k : std::vector<Case>{{2, 3, 5, 7, 1, 1, 1, 1},
                                         {1, 2, 4, 4, 0, 1, 2, 0},
                                         {3, 1, 6, 5, 2, 0, 0, 3},
                                         {2, 2, 7, 6, -1, -2, -1, 0},
                                         {1, 1, 1, 1, 0, 0, 0, 0},
                                         {2, 4, 33, 17, 3, -1, -2, 5}}) {
    SCOPED_TRACE(std::to_string(k.h) + "x" + std::to_string(k.w) + " pads " +
                 std::to_string(k.top) + "," + std::to_string(k.left) + "," +
                 std::to_string(k.bottom) + "," + std::to_string(k.right));
    const Shape in{k.n, k.c, k.h, k.w};
    const Shape out{k.n, k.c, k.h + k.top + k.bottom, k.w + k.left + k.right};
    const std::vector<float> x = RandomUniform(static_cast<size_t>(in.numel()), 31);
    Tensor x_t = ToDevice(be, x, in);
    Tensor y = ToDevice(be, RandomUniform(static_cast<size_t>(out.numel()), 32), out);
    be.Pad2d(x_t, k.top, k.left, &y);
    std::vector<double> ref_y;
    ref::Pad2d(ToDouble(x), k.n * k.c, k.h, k.w, k.top, k.left, k.bottom, k.right, &ref_y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, kExactTol));
  }
}

// NCHW <-> NHWC (the flatten of a channels-last activation and its gradient): exact copies, on
// shapes around the 16 x 16 tiles (one channel, one position, partial tiles, several tiles).
TEST_P(ElementwiseTest, ChannelsLastLayoutChanges) {
  Backend& be = backend();
  for (const Shape& s : std::vector<Shape>{{2, 3, 5, 7},
                                           {1, 1, 4, 4},
                                           {3, 40, 1, 1},
                                           {2, 64, 7, 7},
                                           {1, 33, 9, 65},
                                           {5, 96, 16, 16}}) {
    SCOPED_TRACE(s.ToString());
    const std::vector<float> x = RandomUniform(static_cast<size_t>(s.numel()), 33);
    const Tensor x_t = ToDevice(be, x, s);
    Tensor y = ToDevice(be, RandomUniform(static_cast<size_t>(s.numel()), 34), s);
    be.ToChannelsLast(x_t, &y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ToDouble(ToNhwc(x, s)), kExactTol)) << "to";
    be.FromChannelsLast(x_t, &y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ToDouble(FromNhwc(x, s)), kExactTol)) << "from";
  }
  Tensor x_t = ToDevice(be, RandomUniform(24, 35), {2, 3, 2, 2});
  EXPECT_THROW(be.ToChannelsLast(x_t, &x_t), InternalError) << "y aliases x";
}

TEST_P(ElementwiseTest, ReluOnImageShape) {
  Backend& be = backend();
  const Shape shape{2, 3, 7, 5};
  const std::vector<float> x = RandomDistinct(static_cast<size_t>(shape.numel()), 13);
  Tensor x_t = ToDevice(be, x, shape);
  Tensor y = be.Empty(shape, DType::kF32, "y");
  be.ReluForward(x_t, &y);
  std::vector<double> ref_y;
  ref::ReluForward(ToDouble(x), &ref_y);
  EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, kExactTol));
}

TEST_P(ElementwiseTest, Add) {
  Backend& be = backend();
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> a = RandomUniform(static_cast<size_t>(n), 21);
    const std::vector<float> b = RandomUniform(static_cast<size_t>(n), 22);
    std::vector<double> ref_y;
    ref::Add(ToDouble(a), ToDouble(b), &ref_y);
    const Tolerance tol = ForPrecision(Precision::kF32);

    Tensor a_t = ToDevice(be, a, {n});
    Tensor b_t = ToDevice(be, b, {n});
    Tensor y = be.Empty({n}, DType::kF32, "y");
    be.Add(a_t, b_t, &y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, tol)) << "y separate";

    be.Add(a_t, b_t, &a_t);  // y aliases a
    EXPECT_TRUE(AllClose(ToHost(be, a_t), ref_y, tol)) << "y aliases a";

    Tensor a2 = ToDevice(be, a, {n});
    be.Add(a2, b_t, &b_t);  // y aliases b
    EXPECT_TRUE(AllClose(ToHost(be, b_t), ref_y, tol)) << "y aliases b";
  }
}

// A residual sum with its ReLU folded in: against the reference's max(a + b, 0), and bit for bit
// Add then ReluForward on the same backend (the fold must change no number), separate and in
// place over either input.
TEST_P(ElementwiseTest, AddRelu) {
  Backend& be = backend();
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> a = RandomUniform(static_cast<size_t>(n), 24);
    const std::vector<float> b = RandomUniform(static_cast<size_t>(n), 25);
    std::vector<double> ref_y;
    ref::Add(ToDouble(a), ToDouble(b), &ref_y);
    for (double& v : ref_y) v = std::max(v, 0.0);
    Tensor a_t = ToDevice(be, a, {n}), b_t = ToDevice(be, b, {n});
    Tensor sum = be.Empty({n}, DType::kF32, "sum"), want = be.Empty({n}, DType::kF32, "want");
    be.Add(a_t, b_t, &sum);
    be.ReluForward(sum, &want);
    const std::vector<float> want_h = ToHost(be, want);

    Tensor y = be.Empty({n}, DType::kF32, "y");
    be.AddRelu(a_t, b_t, &y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, ForPrecision(Precision::kF32))) << "reference";
    EXPECT_EQ(ToHost(be, y), want_h) << "Add then ReluForward";
    be.AddRelu(a_t, b_t, &a_t);  // y aliases a
    EXPECT_EQ(ToHost(be, a_t), want_h) << "y aliases a";
    Tensor a2 = ToDevice(be, a, {n});
    be.AddRelu(a2, b_t, &b_t);  // y aliases b
    EXPECT_EQ(ToHost(be, b_t), want_h) << "y aliases b";
  }
}

TEST_P(ElementwiseTest, AddSelf) {
  Backend& be = backend();
  const std::vector<float> a = RandomUniform(1009, 23);
  Tensor a_t = ToDevice(be, a, {1009});
  be.Add(a_t, a_t, &a_t);  // y aliases both inputs
  std::vector<double> ref_y;
  ref::Add(ToDouble(a), ToDouble(a), &ref_y);
  EXPECT_TRUE(AllClose(ToHost(be, a_t), ref_y, kExactTol));
}

// The channel concatenation's copy: columns of rows between different row lengths, exact.
TEST_P(ElementwiseTest, CopyColumns) {
  Backend& be = backend();
  for (const int64_t rows : {int64_t{1}, int64_t{3}, int64_t{257}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows));
    const Shape src_shape{rows, 2, 3, 3}, dst_shape{rows, 5, 3, 3};  // (N, C, H, W), 9 per channel
    const std::vector<float> src = RandomUniform(static_cast<size_t>(src_shape.numel()), 21);
    const std::vector<float> dst0 = RandomUniform(static_cast<size_t>(dst_shape.numel()), 22);
    Tensor s = ToDevice(be, src, src_shape);
    Tensor d = ToDevice(be, dst0, dst_shape);
    be.CopyColumns(s, 9, &d, 27, 9);  // channel 1 of src into channel 3 of dst
    std::vector<double> want = ToDouble(dst0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < 9; ++k) {
        want[static_cast<size_t>(r * 45 + 27 + k)] = src[static_cast<size_t>(r * 18 + 9 + k)];
      }
    }
    EXPECT_TRUE(AllClose(ToHost(be, d), want, kExactTol));
  }
  Tensor s = be.Zeros({2, 4}, DType::kF32, "s");
  Tensor d = be.Zeros({2, 4}, DType::kF32, "d");
  EXPECT_THROW(be.CopyColumns(s, 2, &d, 0, 3), InternalError);  // past the end of src's rows
  Tensor other = be.Zeros({3, 4}, DType::kF32, "other");
  EXPECT_THROW(be.CopyColumns(s, 0, &other, 0, 4), InternalError);  // different row counts
}

TEST_P(ElementwiseTest, Scale) {
  Backend& be = backend();
  for (int64_t n : kSizes) {
    for (float alpha : {0.5f, -3.0f, 0.0f, 1.0f / 3.0f}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " alpha=" + std::to_string(alpha));
      const std::vector<float> x = RandomUniform(static_cast<size_t>(n), 31);
      Tensor t = ToDevice(be, x, {n});
      be.Scale(&t, alpha);
      std::vector<double> ref_t = ToDouble(x);
      ref::Scale(&ref_t, alpha);
      EXPECT_TRUE(AllClose(ToHost(be, t), ref_t, kExactTol));
    }
  }
}

TEST_P(ElementwiseTest, DropoutZeroIsIdentity) {
  Backend& be = backend();
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> x = RandomUniform(static_cast<size_t>(n), 41);
    Tensor x_t = ToDevice(be, x, {n});
    Tensor y = be.Empty({n}, DType::kF32, "y");
    be.DropoutForward(x_t, 0.0f, 1234, &y);
    EXPECT_TRUE(AllClose(ToHost(be, y), ToDouble(x), 0.0, 0.0)) << "forward";
    Tensor dx = be.Empty({n}, DType::kF32, "dx");
    be.DropoutBackward(x_t, 0.0f, 1234, &dx);
    EXPECT_TRUE(AllClose(ToHost(be, dx), ToDouble(x), 0.0, 0.0)) << "backward";
  }
}

TEST_P(ElementwiseTest, DropoutMatchesReference) {
  Backend& be = backend();
  for (float p : {0.5f, 0.1f, 0.9f}) {
    for (int64_t n : kSizes) {
      for (uint64_t seed : {uint64_t{0}, uint64_t{42}, uint64_t{0xDEADBEEFCAFEull}}) {
        SCOPED_TRACE("p=" + std::to_string(p) + " n=" + std::to_string(n) +
                     " seed=" + std::to_string(seed));
        const std::vector<float> x = RandomDistinct(static_cast<size_t>(n), 51);  // no zeros
        const std::vector<float> dy = RandomUniform(static_cast<size_t>(n), 52);
        Tensor x_t = ToDevice(be, x, {n});
        Tensor y = be.Empty({n}, DType::kF32, "y");
        be.DropoutForward(x_t, p, seed, &y);
        std::vector<double> ref_y, ref_dx;
        ref::DropoutForward(ToDouble(x), p, seed, &ref_y);
        EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, kExactTol)) << "forward";

        Tensor dy_t = ToDevice(be, dy, {n});
        Tensor dx = be.Empty({n}, DType::kF32, "dx");
        be.DropoutBackward(dy_t, p, seed, &dx);
        ref::DropoutBackward(ToDouble(dy), p, seed, &ref_dx);
        EXPECT_TRUE(AllClose(ToHost(be, dx), ref_dx, kExactTol)) << "backward";
      }
    }
  }
}

// The mask keeps about 1 - p of the elements, keeps the mean (inverted dropout), and different
// seeds give different masks.
TEST_P(ElementwiseTest, DropoutStatistics) {
  Backend& be = backend();
  const int64_t n = 200003;
  const float p = 0.5f;
  Tensor ones = be.Empty({n}, DType::kF32, "ones");
  be.Fill(&ones, 1.0f);
  Tensor y1 = be.Empty({n}, DType::kF32, "y1");
  Tensor y2 = be.Empty({n}, DType::kF32, "y2");
  be.DropoutForward(ones, p, 7, &y1);
  be.DropoutForward(ones, p, 8, &y2);
  const std::vector<float> a = ToHost(be, y1), b = ToHost(be, y2);
  int64_t kept = 0, differ = 0;
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i] == 0.0f || a[i] == 2.0f) << "element " << i << " = " << a[i];
    if (a[i] != 0.0f) ++kept;
    if ((a[i] != 0.0f) != (b[i] != 0.0f)) ++differ;
    sum += a[i];
  }
  const double dn = static_cast<double>(n);
  const double sigma = std::sqrt(p * (1.0 - p) / dn);  // of the kept fraction
  EXPECT_NEAR(static_cast<double>(kept) / dn, 1.0 - p, kStatSigmas * sigma);
  // Kept elements are 1 / (1 - p) = 2: the mean is 2 * kept / n.
  EXPECT_NEAR(sum / dn, 1.0, kStatSigmas * 2 * sigma) << "inverted dropout keeps the mean";
  // Two independent masks disagree with probability q = 2 p (1 - p).
  const double q = 2 * p * (1 - p);
  EXPECT_NEAR(static_cast<double>(differ) / dn, q, kStatSigmas * std::sqrt(q * (1 - q) / dn));
}

// Profiling (Backend::EnableProfiling) counts every op on every backend: each op opens an
// OpScope, so Profile() lists it by kind with its call count. Off, nothing is recorded.
TEST_P(ElementwiseTest, ProfileCountsOps) {
  Backend& be = backend();
  const int64_t n = 1009;
  Tensor x = ToDevice(be, RandomDistinct(static_cast<size_t>(n), 51), {n});
  Tensor y = be.Empty({n}, DType::kF32, "y");
  be.ResetProfile();
  be.ReluForward(x, &y);
  EXPECT_TRUE(be.Profile().empty()) << "recorded with profiling off";
  be.EnableProfiling(true);
  be.ReluForward(x, &y);
  be.ReluForward(x, &y);
  be.Add(x, y, &y);
  be.DropoutForward(x, 0.5f, 7, &y);
  be.EnableProfiling(false);
  const std::vector<OpStat> stats = be.Profile();
  be.ResetProfile();
  auto calls = [&](const std::string& name) {
    for (const OpStat& s : stats) {
      if (s.name == name) return s.calls;
    }
    return int64_t{0};
  };
  EXPECT_EQ(calls("relu_fwd"), 2);
  EXPECT_EQ(calls("add"), 1);
  EXPECT_EQ(calls("dropout"), 1);
  for (const OpStat& s : stats) EXPECT_GE(s.seconds, 0.0) << s.name;
}

INSTANTIATE_TEST_SUITE_P(All, ElementwiseTest, ::testing::ValuesIn(TestBackends()),
                         BackendParamName);

}  // namespace
}  // namespace dptrain::testing
