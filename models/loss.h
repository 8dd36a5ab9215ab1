// SPDX-License-Identifier: Apache-2.0
// Training losses over a model's output: softmax cross-entropy against integer labels, or mean
// squared error against float targets. Holds its buffers (probabilities, loss, hit count, output
// gradient) so a step allocates nothing.
#pragma once

#include <string>

#include "core/backend.h"

namespace dptrain {

enum class LossKind : uint8_t { kCrossEntropy, kMse };

class Loss {
 public:
  // output_shape: the model's output with the largest batch, e.g. (B, classes).
  // label_smoothing: cross-entropy's (train.label_smoothing), applied in training only.
  Loss(Backend& be, LossKind kind, const Shape& output_shape, float label_smoothing = 0.f);

  LossKind kind() const { return kind_; }
  // Sum of the per-sample losses of the batch into loss_sum() (and argmax hits into correct()
  // for cross-entropy). targets: i32 (n) labels, or f32 with the output's shape. Evaluation
  // (training = false) reports the plain cross-entropy, without label smoothing.
  void Forward(const Tensor& output, const Tensor& targets, bool training = true);
  // Writes d(loss)/d(output) for the mean over `mean_over` samples (the micro-batch), times
  // `scale` (dynamic loss scaling; 1 otherwise).
  const Tensor& Backward(const Tensor& output, const Tensor& targets, int64_t mean_over,
                         float scale = 1.f);

  const Tensor& loss_sum() const { return loss_sum_; }  // (1) f32
  const Tensor& correct() const { return correct_; }    // (1) f32, cross-entropy only

 private:
  Backend& backend_;
  LossKind kind_;
  int64_t per_sample_;
  float label_smoothing_;
  Tensor probs_, loss_sum_, correct_, dout_buf_, dout_;
};

}  // namespace dptrain
