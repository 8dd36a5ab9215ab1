// SPDX-License-Identifier: Apache-2.0
// Layers that join several node outputs: Add (elementwise sum of equal shapes: a residual
// connection; or a per-channel shift), Mul (a product, or a per-channel scaling) and Concat
// (along the channel axis, dimension 1: a dense block). Graph-only: they implement the *Inputs
// versions of the layer interface.
#pragma once

#include <vector>

#include "models/layer.h"

namespace dptrain {

class BatchNorm;

// The one-input calls of a join are a ConfigError asking for `inputs`: only the graph's
// several-input calls run it.
class Join : public Layer {
 public:
  using Layer::Layer;
  Shape Setup(const Shape& in, const SetupOptions& opts) final;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) final;
  const Tensor& Backward(const Tensor& dy, bool accumulate) final;
};

// The sum of two or more inputs of equal shapes, or of two where one is (N, C, H, W) and the
// other (N, C, 1, 1), added to every position of its channel (either order).
class Add final : public Join {
 public:
  Add(Backend& be, std::string name) : Join(be, std::move(name)) {}
  std::string type() const override { return "add"; }
  Shape SetupInputs(const std::vector<Shape>& in, const SetupOptions& opts) override;
  const Tensor& ForwardInputs(const std::vector<const Tensor*>& x,
                              const ForwardContext& ctx) override;
  // An input of the output's shape gets dy itself (no copy); a broadcast one, dy's channel sums.
  // With a folded ReLU, dy gated by the output, written over it.
  void BackwardInputs(const Tensor& dy, bool accumulate, std::vector<const Tensor*>* dx) override;
  // With a folded ReLU on equal shapes, the gate takes a gradient in two parts (a block's output
  // read by the next block's convolution and shortcut).
  bool SumsGradientParts() const override {
    return relu_ && !broadcast_ && backend_.TakesGradientParts();
  }
  // Channels-last, the second part may be a strided shortcut's sampled input gradient.
  bool SumsSampledPart() const override { return SumsGradientParts() && nhwc_; }
  void BackwardInputsSum(const Tensor& dy_a, const Tensor& dy_b, int64_t b_stride, bool accumulate,
                         std::vector<const Tensor*>* dx) override;
  bool PassesGradient() const override { return !relu_; }
  // With a bf16 output its gradient has a buffer of its own (an input gradient: GateInto).
  bool GradientInOutput() const override { return relu_ && !y_bf16_; }
  int64_t ActivationBytesPerSample() const override {
    return (y_bf16_ ? 2 + 4 : 4) * per_sample_ + 4 * (broadcast_ && need_dx_ ? rows_ : 0);
  }
  // In bf16, the sum of a block whose output only bf16 convolutions read (the next block's
  // convolution and shortcut, through the folded ReLU) writes it in bf16 for them, where it
  // applies a batch norm as it adds (AffineAdd, Backend::WritesBf16Sums): the values they would
  // round it to, without the f32 output and their own staging passes. The ReLU's backward gate
  // then reads the bf16 output (the same sign and zeros, but for an f32 sum below 2^-133, which
  // rounds to 0), and writes the gradient into a buffer of its own: the one input gradient that
  // both inputs get, which the graph places with the other input gradients (kEveryInput).
  void OfferBf16OutputToAll(const std::vector<Layer*>& readers) override { readers_ = readers; }
  bool writes_bf16_output() const { return y_bf16_; }  // after Setup
  // The ReLU that alone reads a residual sum (each ResNet block's last): one pass for both.
  bool FoldRelu() override {
    relu_ = true;
    return true;
  }
  // Equal shapes are elementwise: any layout (a broadcast refuses NHWC at Setup).
  bool TakesNhwc() const override { return true; }
  // A batch norm only this sum reads (of two inputs) may leave its normalisation to the sum
  // (BatchNorm::OfferDeferredApply): Forward then applies it as it adds (Backend::AffineAdd).
  void FoldIntoInputs(size_t k, Layer& producer) override;

 private:
  // Where the folded ReLU's gated gradient goes: over the output, or grad_ (y_bf16_).
  Tensor* GateInto();
  BatchNorm* applies_[2] = {nullptr, nullptr};  // offered to (FoldIntoInputs); deferred or not
  std::vector<Layer*> readers_;                 // OfferBf16OutputToAll
  bool y_bf16_ = false;                         // taken at Setup
  bool nhwc_ = false;                           // channels-last (SetupOptions::nhwc_in)
  bool relu_ = false;
  size_t inputs_ = 0;
  int64_t per_sample_ = 0;
  bool broadcast_ = false;  // two inputs, input 1 - wide_ of shape (N, C, 1, 1)
  size_t wide_ = 0;
  int64_t rows_ = 0;  // floats per sample of the broadcast input
  bool need_dx_ = true;
  Tensor out_, y_, narrow_buf_, narrow_dx_;
  Tensor grad_buf_, grad_;  // y_bf16_: the gated gradient (f32), not over the output
};

// The product of two inputs: of equal shapes, or one (N, C, H, W) and the other (N, C, 1, 1)
// scaling each channel (squeeze-and-excitation), in either order.
class Mul final : public Join {
 public:
  Mul(Backend& be, std::string name) : Join(be, std::move(name)) {}
  std::string type() const override { return "mul"; }
  Shape SetupInputs(const std::vector<Shape>& in, const SetupOptions& opts) override;
  const Tensor& ForwardInputs(const std::vector<const Tensor*>& x,
                              const ForwardContext& ctx) override;
  void BackwardInputs(const Tensor& dy, bool accumulate, std::vector<const Tensor*>* dx) override;
  int64_t ActivationBytesPerSample() const override;

 private:
  size_t wide_ = 0;         // which input has the output's shape; the other is broadcast
  int64_t rows_ = 0;        // floats per sample of the narrow input
  int64_t per_sample_ = 0;  // floats per sample of the output
  bool need_dx_ = true;
  Tensor out_, y_, x_[2];
  Tensor dx_buf_[2], dx_[2];
};

class Concat final : public Join {
 public:
  Concat(Backend& be, std::string name) : Join(be, std::move(name)) {}
  std::string type() const override { return "concat"; }
  Shape SetupInputs(const std::vector<Shape>& in, const SetupOptions& opts) override;
  const Tensor& ForwardInputs(const std::vector<const Tensor*>& x,
                              const ForwardContext& ctx) override;
  void BackwardInputs(const Tensor& dy, bool accumulate, std::vector<const Tensor*>* dx) override;
  int64_t ActivationBytesPerSample() const override;

 private:
  std::vector<int64_t> widths_;  // floats per sample of each input
  int64_t per_sample_ = 0;
  bool need_dx_ = true;
  Tensor out_, y_;
  std::vector<Tensor> dx_buf_, dx_;
};

}  // namespace dptrain
