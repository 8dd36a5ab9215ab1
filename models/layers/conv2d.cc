// SPDX-License-Identifier: Apache-2.0
// Conv2d layer: plans the backend op once per batch size, runs forward/backward through it.
#include "models/layers/conv2d.h"

#include <string>

#include "core/error.h"

namespace dptrain {

Conv2d::Conv2d(Backend& be, std::string name, int64_t out_channels, int64_t kernel, int64_t stride,
               int64_t pad, bool bias, int64_t groups, int64_t dilation)
    : Layer(be, std::move(name)),
      out_channels_(out_channels),
      kernel_(kernel),
      stride_(stride),
      pad_(pad),
      groups_(groups),
      dilation_(dilation),
      bias_(bias) {}

Conv2dDesc Conv2d::DescFor(const Shape& in, Precision p, bool x_nhwc, bool y_nhwc) const {
  Conv2dDesc d{in[0],   in[1], in[2], in[3], out_channels_, kernel_,  kernel_,
               stride_, pad_,  bias_, p,     groups_,       dilation_};
  d.relu = fusion_.relu;
  d.x_nhwc = x_nhwc;
  d.y_nhwc = y_nhwc;
  d.x_bf16 = fusion_.x_bf16;
  return d;
}

Conv2dDesc Conv2d::Describe(const Shape& in, const SetupOptions& opts) const {
  DPT_CHECK_AS(ConfigError, in.rank() == 4)
      << "conv2d '" << name_ << "' needs (N, C, H, W) input, got " << in.ToString();
  const Conv2dDesc d = DescFor(in, opts.precision, opts.nhwc_in, opts.nhwc_out);
  DPT_CHECK_AS(ConfigError, groups_ > 0 && in[1] % groups_ == 0 && out_channels_ % groups_ == 0)
      << "conv2d '" << name_ << "': groups " << groups_ << " must divide the " << in[1]
      << " input channels and the " << out_channels_ << " output channels";
  const int64_t span = dilation_ * (kernel_ - 1) + 1;
  DPT_CHECK_AS(ConfigError, span <= in[2] + 2 * pad_ && span <= in[3] + 2 * pad_ && d.out_h() > 0 &&
                                d.out_w() > 0)
      << "conv2d '" << name_ << "': kernel " << kernel_
      << (dilation_ != 1 ? " dilated " + std::to_string(dilation_) : std::string()) << " with pad "
      << pad_ << " does not fit input " << in.ToString();
  return d;
}

Shape Conv2d::Setup(const Shape& in, const SetupOptions& opts) {
  desc_ = Describe(in, opts);
  if (!backend_.Supports(desc_)) {
    DPT_THROW(UnsupportedError)
        << "the " << backend_.name() << " backend does not support " << desc_.ToString()
        << " (layer '" << label() << "'); hint: on CPU use train.precision = \"fp32\" or \"bf16\"; "
        << "on CUDA each operand must have fewer than 2^31 elements "
        << "(lower train.micro_batch) and bf16 needs compute capability 8.0";
  }
  need_dx_ = opts.need_dx;
  Shape out{in[0], out_channels_, desc_.out_h(), desc_.out_w()};
  // Setup may run again (the graph planning its layouts again): nothing of the last one is kept.
  plan_.reset();  // a cached plan counts the layers holding it (one staged input each)
  out_ = dx_buf_ = Tensor();
  flow_ = LayerFlow{};
  if (fusion_.pool_fused) {  // the pool's Setup allocates what the fused op needs
    DPT_CHECK(!need_dx_) << label() << ": fused with its pool, but an input gradient is wanted";
    fused_ = fusion_.pool;
    flow_.forward_passes_input = true;
    return out;
  }
  desc_.dy_bf16 = fusion_.dy_bf16;
  desc_.y_bf16 = fusion_.y_bf16;
  desc_.dx_sub = fusion_.dx_sub;
  DPT_CHECK(!desc_.dx_sub || opts.sampled_input_grad) << label() << ": dx_sub without the offer";
  flow_.input_grad_stride = desc_.dx_sub ? stride_ : 1;
  plan_ = backend_.PrepareConv2d(desc_);
  out_ = OutputBuffer(backend_, opts, out, desc_.y_bf16 ? DType::kBF16 : DType::kF32,
                      label() + " output");
  if (need_dx_) {
    const Shape dx = desc_.dx_sub ? Shape{in[0], in[1], desc_.out_h(), desc_.out_w()} : in;
    dx_buf_ = InputGradBuffer(backend_, opts, 0, dx, DType::kF32, label() + " input gradient");
  }
  return out;
}

void Conv2d::ListParams(std::vector<ParamRef>* out) {
  const int64_t fan_in = desc_.group_c() * kernel_ * kernel_;  // as PyTorch's init
  out->push_back({"weight", Shape{out_channels_, desc_.group_c(), kernel_, kernel_},
                  Init::kFanInUniform, fan_in, &w_, &gw_});
  if (bias_) out->push_back({"bias", Shape{out_channels_}, Init::kFanInUniform, fan_in, &b_, &gb_});
}

void Conv2d::PrepareFor(int64_t n) {
  if (plan_ != nullptr && n == desc_.n) return;
  // The old plan goes first: once the backend's cache was released to make room (an evaluation
  // batch that ran out of memory), this layer holds its last reference, and the new batch
  // size's plan may only fit without it. After a throw the layer has no plan and prepares one
  // on its next call.
  plan_.reset();
  desc_.n = n;
  plan_ = backend_.PrepareConv2d(desc_);
}

const Tensor& Conv2d::Forward(const Tensor& x, const ForwardContext& /*ctx*/) {
  x_ = x;
  if (fusion_.pool_fused) {
    fused_.conv.n = fused_.pool.n = x.shape()[0];
    return x;  // the pool reads the input and runs the fused op
  }
  PrepareFor(x.shape()[0]);
  y_ = out_.Batch(desc_.n);
  backend_.Conv2dForward(*plan_, x, w_, bias_ ? &b_ : nullptr, &y_);
  return y_;
}

const Tensor& Conv2d::Backward(const Tensor& dy, bool accumulate) {
  if (fusion_.pool_fused) return dx_;  // the pool wrote the gradients; no input gradient is wanted
  if (need_dx_) dx_ = dx_buf_.Batch(desc_.n);
  // With a folded ReLU, dy is gated by the output, written over it: every reader of the output
  // (the ReLU's readers) has run its backward before this layer's.
  const bool gate = fusion_.relu && !fusion_.gate_handed;
  if (gate) backend_.ReluBackward(y_, dy, &y_);
  backend_.Conv2dBackward(*plan_, x_, gate ? y_ : dy, w_, need_dx_ ? &dx_ : nullptr, &gw_,
                          bias_ ? &gb_ : nullptr, accumulate);
  return dx_;
}

int64_t Conv2d::ActivationBytesPerSample() const {
  if (fusion_.pool_fused) return 0;  // the pool holds the output (pooled) and nothing else is kept
  const int64_t out = out_channels_ * desc_.out_h() * desc_.out_w();
  const int64_t dx = desc_.c * (desc_.dx_sub ? desc_.out_h() * desc_.out_w() : desc_.h * desc_.w);
  return (desc_.y_bf16 ? 2 : 4) * out + (need_dx_ ? 4 * dx : 0);
}

}  // namespace dptrain
