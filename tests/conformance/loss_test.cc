// SPDX-License-Identifier: Apache-2.0
// Losses on every built backend against the double reference: softmax cross-entropy (loss sum,
// probabilities, argmax hits; batch 1, one class, logits ~1e3 that overflow a naive exp) and its
// backward, MSE sum and its backward.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/backend.h"
#include "tests/testing/backends.h"
#include "tests/testing/reference_ops.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

struct XentCase {
  int64_t n, k;
  float offset, spread;  // logits = offset + spread * U[-1, 1]
};

const std::vector<XentCase> kXentCases = {
    {1, 1, 0.f, 1.f},       // one class: p = 1, loss 0, always correct
    {1, 10, 0.f, 3.f},      // batch 1
    {7, 3, 0.f, 2.f},       // odd
    {32, 10, 0.f, 5.f},     // the usual
    {5, 1000, 0.f, 4.f},    // many classes
    {9, 10, 1000.f, 20.f},  // large logits: exp(1000) overflows without max subtraction
    {6, 7, -1000.f, 20.f},  // large negative logits: exp underflows to 0 without it
    {4, 5, 0.f, 80.f},      // very peaked: probabilities of ~1e-70 (0 in f32), loss ~1e2
};

class LossTest : public BackendTest {};

TEST_P(LossTest, SoftmaxCrossEntropy) {
  Backend& be = backend();
  uint32_t seed = 7000;
  for (const XentCase& c : kXentCases) {
    for (const float eps : {0.f, 0.1f}) {  // train.label_smoothing
      seed += 10;
      SCOPED_TRACE("n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " offset=" +
                   std::to_string(c.offset) + " label_smoothing=" + std::to_string(eps));
      std::vector<float> logits = RandomUniform(static_cast<size_t>(c.n * c.k), seed);
      for (float& v : logits) v = c.offset + c.spread * v;
      const std::vector<int32_t> labels =
          RandomLabels(static_cast<size_t>(c.n), static_cast<int32_t>(c.k), seed + 1);

      Tensor logits_t = ToDevice(be, logits, {c.n, c.k});
      Tensor labels_t = ToDeviceI32(be, labels, {c.n});
      Tensor probs = be.Empty({c.n, c.k}, DType::kF32, "probs");
      Tensor loss = be.Empty({1}, DType::kF32, "loss");
      Tensor correct = be.Empty({1}, DType::kF32, "correct");
      be.SoftmaxCrossEntropy(logits_t, labels_t, eps, &probs, &loss, &correct);

      std::vector<double> ref_probs;
      double ref_loss = 0.0;
      int64_t ref_correct = 0;
      ref::SoftmaxCrossEntropy(c.n, c.k, ToDouble(logits), labels, &ref_probs, &ref_loss,
                               &ref_correct, eps);
      EXPECT_TRUE(AllClose(ToHost(be, probs), ref_probs, ForPrecision(Precision::kF32))) << "probs";
      // The loss is a sum over the batch of log-sum-exps over k classes.
      EXPECT_TRUE(Close(ScalarToHost(be, loss), ref_loss, ForReduction(Precision::kF32, c.n * c.k)))
          << "loss_sum";
      EXPECT_EQ(ScalarToHost(be, correct), static_cast<double>(ref_correct)) << "correct";
    }
  }
}

// Rows with tied maxima: the prediction is the lowest tied index (the reference's rule, as
// torch.argmax and std::max_element).
TEST_P(LossTest, ArgmaxTiesPickLowestIndex) {
  Backend& be = backend();
  const int64_t n = 4, k = 3;
  const std::vector<float> logits = {
      1.f, 1.f,  1.f,  // all tied -> 0
      0.f, 2.f,  2.f,  // 1 and 2 tied -> 1
      5.f, -1.f, 5.f,  // 0 and 2 tied -> 0
      3.f, 3.f,  0.f,  // 0 and 1 tied -> 0
  };
  // Lowest-index ties hit rows 0, 1 and 3 (3 correct); highest-index ties would hit only row 2.
  const std::vector<int32_t> labels = {0, 1, 2, 0};
  Tensor probs = be.Empty({n, k}, DType::kF32, "probs");
  Tensor loss = be.Empty({1}, DType::kF32, "loss");
  Tensor correct = be.Empty({1}, DType::kF32, "correct");
  be.SoftmaxCrossEntropy(ToDevice(be, logits, {n, k}), ToDeviceI32(be, labels, {n}), 0.f, &probs,
                         &loss, &correct);
  std::vector<double> ref_probs;
  double ref_loss = 0.0;
  int64_t ref_correct = 0;
  ref::SoftmaxCrossEntropy(n, k, ToDouble(logits), labels, &ref_probs, &ref_loss, &ref_correct);
  ASSERT_EQ(ref_correct, 3);
  EXPECT_EQ(ScalarToHost(be, correct), 3.0);
  EXPECT_TRUE(Close(ScalarToHost(be, loss), ref_loss, ForReduction(Precision::kF32, n * k)));
}

TEST_P(LossTest, SoftmaxCrossEntropyBackward) {
  Backend& be = backend();
  uint32_t seed = 7500;
  for (const XentCase& c : kXentCases) {
    for (float scale : {1.0f, 1.0f / static_cast<float>(c.n), -0.5f}) {
      seed += 10;
      const float eps = scale == 1.0f ? 0.f : 0.2f;  // label smoothing on two of the three
      SCOPED_TRACE("n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                   " scale=" + std::to_string(scale) + " label_smoothing=" + std::to_string(eps));
      // Probabilities as the forward leaves them: rows of a softmax, rounded to f32.
      std::vector<float> logits = RandomUniform(static_cast<size_t>(c.n * c.k), seed);
      for (float& v : logits) v = c.spread * v;
      const std::vector<int32_t> labels =
          RandomLabels(static_cast<size_t>(c.n), static_cast<int32_t>(c.k), seed + 1);
      std::vector<double> p_d;
      double unused_loss = 0.0;
      int64_t unused_correct = 0;
      ref::SoftmaxCrossEntropy(c.n, c.k, ToDouble(logits), labels, &p_d, &unused_loss,
                               &unused_correct);
      std::vector<float> probs(p_d.begin(), p_d.end());

      Tensor dlogits = be.Empty({c.n, c.k}, DType::kF32, "dlogits");
      be.SoftmaxCrossEntropyBackward(ToDevice(be, probs, {c.n, c.k}),
                                     ToDeviceI32(be, labels, {c.n}), eps, scale, &dlogits);
      std::vector<double> ref_d;
      ref::SoftmaxCrossEntropyBackward(c.n, c.k, ToDouble(probs), labels, scale, &ref_d, eps);
      EXPECT_TRUE(AllClose(ToHost(be, dlogits), ref_d, ForPrecision(Precision::kF32)));
    }
  }
}

TEST_P(LossTest, Mse) {
  Backend& be = backend();
  uint32_t seed = 8000;
  for (const Shape& shape : {Shape{1}, Shape{1, 1}, Shape{7, 3}, Shape{64, 10}, Shape{1000}}) {
    seed += 10;
    SCOPED_TRACE("shape " + shape.ToString());
    const size_t n = static_cast<size_t>(shape.numel());
    const std::vector<float> y = RandomUniform(n, seed, -2.f, 2.f);
    const std::vector<float> t = RandomUniform(n, seed + 1, -2.f, 2.f);
    Tensor y_t = ToDevice(be, y, shape);
    Tensor t_t = ToDevice(be, t, shape);
    Tensor loss = be.Empty({1}, DType::kF32, "loss");
    be.MseLoss(y_t, t_t, &loss);
    const double ref_loss = ref::MseLoss(ToDouble(y), ToDouble(t));
    EXPECT_TRUE(
        Close(ScalarToHost(be, loss), ref_loss, ForReduction(Precision::kF32, shape.numel())))
        << "loss_sum";

    for (float scale : {1.0f, 1.0f / static_cast<float>(n), -3.0f}) {
      SCOPED_TRACE("scale=" + std::to_string(scale));
      Tensor dy = be.Empty(shape, DType::kF32, "dy");
      be.MseBackward(y_t, t_t, scale, &dy);
      std::vector<double> ref_dy;
      ref::MseBackward(ToDouble(y), ToDouble(t), scale, &ref_dy);
      EXPECT_TRUE(AllClose(ToHost(be, dy), ref_dy, ForPrecision(Precision::kF32)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, LossTest, ::testing::ValuesIn(TestBackends()), BackendParamName);

}  // namespace
}  // namespace dptrain::testing
