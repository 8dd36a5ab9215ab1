// SPDX-License-Identifier: Apache-2.0
// BatchNorm layer.
#include "models/layers/batch_norm.h"

#include "core/error.h"

namespace dptrain {

Shape BatchNorm::Setup(const Shape& in, const SetupOptions& opts) {
  DPT_CHECK_AS(ConfigError, in.rank() == 2 || in.rank() == 4)
      << "batchnorm '" << name_ << "' needs (N, C) or (N, C, H, W) input, got " << in.ToString();
  channels_ = in[1];
  args_ = BaseArgs();
  args_.nhwc = opts.nhwc_in && in.rank() == 4;
  args_.x_bf16 = fusion_.x_bf16;
  args_.y_bf16 = fusion_.y_bf16;
  args_.dx_bf16 = fusion_.dx_bf16;
  per_sample_ = in.numel() / in[0];
  need_dx_ = opts.need_dx;
  DPT_CHECK(need_dx_ || !args_.dx_bf16) << label() << ": a bf16 input gradient nobody reads";
  // Without need_dx the backward writes its f32 dx over the output buffer: it must be f32 and
  // there (no bf16 output, no deferred apply).
  DPT_CHECK(need_dx_ || (!args_.y_bf16 && !fusion_.deferred))
      << label() << ": a bf16 or deferred output without an input gradient buffer";
  DPT_CHECK(!fusion_.deferred || (args_.nhwc && !args_.relu && !args_.y_bf16))
      << label() << ": a deferred apply of an NCHW, ReLU or bf16 output";
  flow_ = LayerFlow{};
  flow_.forward_passes_input = fusion_.deferred;
  flow_.sums_gradient_parts = args_.nhwc && backend_.capabilities().gradient_parts;
  save_mean_ = backend_.Empty(Shape{channels_}, DType::kF32, label() + " saved mean");
  save_invstd_ = backend_.Empty(Shape{channels_}, DType::kF32, label() + " saved invstd");
  out_ = affine_ = Tensor();
  if (fusion_.deferred) {
    affine_ = backend_.Empty(Shape{2 * channels_}, DType::kF32, label() + " scale and shift");
  } else {
    out_ = OutputBuffer(backend_, opts, in, args_.y_bf16 ? DType::kBF16 : DType::kF32,
                        label() + " output");
  }
  // A forward run again takes its running update here, where nothing reads it.
  discard_mean_ = discard_var_ = Tensor();
  if (opts.recompute) {
    discard_mean_ = backend_.Empty(Shape{channels_}, DType::kF32, label() + " recompute scratch");
    discard_var_ = backend_.Empty(Shape{channels_}, DType::kF32, label() + " recompute scratch");
    backend_.Zero(&discard_mean_);
    backend_.Zero(&discard_var_);
  }
  dx_buf_ = Tensor();  // Setup may run again
  if (need_dx_) {
    dx_buf_ = InputGradBuffer(backend_, opts, 0, in, args_.dx_bf16 ? DType::kBF16 : DType::kF32,
                              label() + " input gradient");
  }
  return in;
}

void BatchNorm::ListParams(std::vector<ParamRef>* out) {
  out->push_back({"weight", Shape{channels_}, Init::kOnes, 1, &gamma_, &ggamma_});
  out->push_back({"bias", Shape{channels_}, Init::kZeros, 1, &beta_, &gbeta_});
}

void BatchNorm::ListBuffers(std::vector<ParamRef>* out) {
  out->push_back({"running_mean", Shape{channels_}, Init::kZeros, 1, &running_mean_, nullptr});
  out->push_back({"running_var", Shape{channels_}, Init::kOnes, 1, &running_var_, nullptr});
}

const Tensor& BatchNorm::Forward(const Tensor& x, const ForwardContext& ctx) {
  x_ = x;
  // deferred: the statistics and the scale and shift only; the reading sum applies them
  if (!ctx.training) {
    if (fusion_.deferred) {
      backend_.BatchNormAffineInference(args_, gamma_, beta_, running_mean_, running_var_,
                                        &affine_);
      return x_;
    }
    y_ = out_.Batch(x.shape()[0]);
    backend_.BatchNormForwardInference(args_, x, gamma_, beta_, running_mean_, running_var_, &y_);
    return y_;
  }
  // Run again before the backward (activation recompute): the same batch statistics and output,
  // and the running statistics as they were.
  const bool again = ctx.recompute;
  DPT_CHECK(!again || discard_mean_.defined()) << label() << ": recomputed but not set up for it";
  Tensor* mean = again ? &discard_mean_ : &running_mean_;
  Tensor* var = again ? &discard_var_ : &running_var_;
  if (fusion_.deferred) {
    backend_.BatchNormAffineTraining(args_, x, gamma_, beta_, mean, var, &affine_, &save_mean_,
                                     &save_invstd_);
    return x_;
  }
  y_ = out_.Batch(x.shape()[0]);
  backend_.BatchNormForwardTraining(args_, x, gamma_, beta_, mean, var, &y_, &save_mean_,
                                    &save_invstd_);
  return y_;
}

const Tensor& BatchNorm::Backward(const Tensor& dy, bool accumulate) {
  return Grad(dy, nullptr, accumulate);
}

void BatchNorm::BackwardInputsSum(const Tensor& dy_a, const Tensor& dy_b, int64_t b_stride,
                                  bool accumulate, std::vector<const Tensor*>* dx) {
  DPT_CHECK(b_stride == 1) << label() << ": a sampled gradient part (sums_sampled_part says no)";
  dx->assign(1, &Grad(dy_a, &dy_b, accumulate));
}

const Tensor& BatchNorm::Grad(const Tensor& dy, const Tensor* dy2, bool accumulate) {
  // The backend computes dx together with the parameter gradients; without need_dx it writes
  // into the output buffer, which is no longer needed once backward has reached this layer.
  dx_ = need_dx_ ? dx_buf_.Batch(dy.shape()[0]) : out_.Batch(dy.shape()[0]);
  // With a folded ReLU, y_ gates dy; written over by dx_ when dx_ is the output buffer.
  const Tensor* gate = args_.relu && !fusion_.gate_handed ? &y_ : nullptr;
  if (dy2 != nullptr) {
    backend_.BatchNormBackwardSum(args_, x_, dy, *dy2, gate, gamma_, beta_, save_mean_,
                                  save_invstd_, &dx_, &ggamma_, &gbeta_, accumulate);
  } else {
    backend_.BatchNormBackward(args_, x_, dy, gate, gamma_, beta_, save_mean_, save_invstd_, &dx_,
                               &ggamma_, &gbeta_, accumulate);
  }
  if (!need_dx_) dx_ = Tensor();
  return dx_;
}

}  // namespace dptrain
