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
// What the graph's passes (models/passes) decided for a residual sum, written before its Setup.
struct AddFusion {
  // Before Setup (fuse.cc): the ReLU that alone reads the sum is applied here (backward gates dy
  // by the output, in place over it), and the batch norms that feed inputs 0 and 1, whose outputs
  // only this sum reads, are applied by it where they deferred it (BatchNormFusion::deferred:
  // Backend::AffineAdd).
  bool relu = false;
  BatchNorm* applies[2] = {nullptr, nullptr};
  // At Setup (choose.cc): the sum written in bf16 for the bf16 convolutions that alone read it
  // (BackendCapabilities::bf16_sums; a ResNet block's output, read by the next block's
  // convolution and shortcut).
  bool y_bf16 = false;
};

class Add final : public Join {
 public:
  Add(Backend& be, std::string name) : Join(be, std::move(name)) {}
  std::string type() const override { return "add"; }
  Shape SetupInputs(const std::vector<Shape>& in, const SetupOptions& opts) override;
  const Tensor& ForwardInputs(const std::vector<const Tensor*>& x,
                              const ForwardContext& ctx) override;
  void BackwardInputs(const Tensor& dy, bool accumulate, std::vector<const Tensor*>* dx) override;
  void BackwardInputsSum(const Tensor& dy_a, const Tensor& dy_b, int64_t b_stride, bool accumulate,
                         std::vector<const Tensor*>* dx) override;
  int64_t ActivationBytesPerSample() const override {
    return (y_bf16_ ? 2 + 4 : 4) * per_sample_ + 4 * (broadcast_ && need_dx_ ? rows_ : 0);
  }

  AddFusion& fusion() { return fusion_; }
  bool writes_bf16_output() const { return y_bf16_; }  // after Setup
  // Whether inputs of these shapes are summed by broadcasting an (N, C, 1, 1) over an
  // (N, C, H, W) (NCHW only: the sum runs over N * C rows), and which input is the wide one.
  static bool Broadcasts(const std::vector<Shape>& in, size_t* wide = nullptr);

 private:
  Tensor* GateInto();
  AddFusion fusion_;
  bool y_bf16_ = false;  // as set up
  bool nhwc_ = false;    // channels-last (SetupOptions::nhwc_in)
  size_t inputs_ = 0;
  int64_t per_sample_ = 0;
  bool broadcast_ = false;  // two inputs, input 1 - wide_ of shape (N, C, 1, 1)
  size_t wide_ = 0;
  int64_t rows_ = 0;  // floats per sample of the broadcast input
  bool need_dx_ = true;
  Tensor out_, y_, narrow_buf_, narrow_dx_;
  Tensor grad_buf_, grad_;  // y_bf16_: the gated gradient (f32), not over the output
};

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
