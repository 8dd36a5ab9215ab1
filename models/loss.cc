// SPDX-License-Identifier: Apache-2.0
// Loss wrapper over the backend's loss ops.
#include "models/loss.h"

#include "core/error.h"

namespace dptrain {

Loss::Loss(Backend& be, LossKind kind, const Shape& output_shape, float label_smoothing)
    : backend_(be),
      kind_(kind),
      per_sample_(output_shape.numel() / output_shape[0]),
      label_smoothing_(label_smoothing) {
  if (kind_ == LossKind::kCrossEntropy) {
    DPT_CHECK_AS(ConfigError, output_shape.rank() == 2)
        << "cross-entropy needs a (N, classes) model output, got " << output_shape.ToString();
    probs_ = be.Empty(output_shape, DType::kF32, "softmax probabilities");
  }
  loss_sum_ = be.Zeros(Shape{1}, DType::kF32, "loss");
  correct_ = be.Zeros(Shape{1}, DType::kF32, "correct count");
  dout_buf_ = be.Empty(output_shape, DType::kF32, "output gradient");
}

void Loss::Forward(const Tensor& output, const Tensor& targets, bool training) {
  if (kind_ == LossKind::kCrossEntropy) {
    Tensor probs = probs_.Batch(output.shape()[0]);
    backend_.SoftmaxCrossEntropy(output, targets, training ? label_smoothing_ : 0.f, &probs,
                                 &loss_sum_, &correct_);
  } else {
    DPT_CHECK_AS(DataError, targets.numel() == output.numel())
        << "mse: targets " << targets.shape().ToString() << " do not match the model output "
        << output.shape().ToString();
    backend_.MseLoss(output, targets.View(output.shape()), &loss_sum_);
  }
}

const Tensor& Loss::Backward(const Tensor& output, const Tensor& targets, int64_t mean_over,
                             float scale) {
  const int64_t n = output.shape()[0];
  dout_ = dout_buf_.Batch(n);
  if (kind_ == LossKind::kCrossEntropy) {
    backend_.SoftmaxCrossEntropyBackward(probs_.Batch(n), targets, label_smoothing_,
                                         scale / static_cast<float>(mean_over), &dout_);
  } else {
    // PyTorch's MSELoss averages over every element: mean_over samples x per-sample outputs.
    backend_.MseBackward(output, targets.View(output.shape()),
                         scale / static_cast<float>(mean_over * per_sample_), &dout_);
  }
  return dout_;
}

}  // namespace dptrain
