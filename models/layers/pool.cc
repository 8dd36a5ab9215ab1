// SPDX-License-Identifier: Apache-2.0
// Pooling layer. Max pooling keeps the backend's workspace (argmax positions) from the training
// forward for backward.
#include "models/layers/pool.h"

#include "core/error.h"

namespace dptrain {

Pool2d::Pool2d(Backend& be, std::string name, PoolKind kind, int64_t kernel, int64_t stride,
               int64_t pad, bool ceil_mode, bool count_include_pad)
    : Layer(be, std::move(name)),
      kind_(kind),
      kernel_(kernel),
      stride_(stride),
      pad_(pad),
      ceil_mode_(ceil_mode),
      count_include_pad_(count_include_pad) {}

PoolDesc Pool2d::DescFor(const Shape& in, bool nhwc, bool nchw_out) const {
  const int64_t kernel = kernel_ == 0 ? in[2] : kernel_;  // 0: global pooling
  const int64_t stride = kernel_ == 0 ? in[2] : (stride_ == 0 ? kernel : stride_);
  PoolDesc d{kind_,  in[0],  in[1], in[2],      in[3],
             kernel, stride, pad_,  ceil_mode_, count_include_pad_,
             nhwc};
  // One channel or one output position is the same bytes in both layouts.
  d.y_nchw = nhwc && nchw_out && d.c > 1 && d.out_h() * d.out_w() > 1;
  return d;
}

Shape Pool2d::Setup(const Shape& in, const SetupOptions& opts) {
  DPT_CHECK_AS(ConfigError, in.rank() == 4)
      << type() << " '" << name_ << "' needs (N, C, H, W) input, got " << in.ToString();
  if (kernel_ == 0) {  // global pooling
    DPT_CHECK_AS(ConfigError, in[2] == in[3])
        << "global " << type() << " '" << name_ << "' needs square input, got " << in.ToString();
  }
  desc_ = DescFor(in, opts.nhwc_in, !opts.nhwc_out);
  const int64_t kernel = desc_.kernel;
  fused_ = fusion_.conv != nullptr ? fusion_.conv->pool_fused() : nullptr;
  // The bf16 convolution before this pool reads its gradient in bf16: written so here.
  desc_.dx_bf16 = fusion_.dx_bf16;
  DPT_CHECK(!desc_.dx_bf16 ||
            (fused_ == nullptr && fusion_.conv != nullptr && fusion_.conv->reads_dy_bf16()))
      << label() << ": a bf16 input gradient its convolution does not read";
  DPT_CHECK_AS(ConfigError, desc_.Valid())
      << type() << " '" << label() << "': kernel " << kernel << " stride " << desc_.stride
      << " pad " << pad_ << " does not fit input " << in.ToString()
      << " (the kernel must fit the padded input, and pad be at most half the kernel)";
  if (!backend_.Supports(desc_))
    DPT_THROW(UnsupportedError) << "the " << backend_.name() << " backend does not support "
                                << desc_.ToString() << " (layer '" << label()
                                << "'); hint: on CPU use train.precision = \"fp32\" or \"bf16\"";
  need_dx_ = opts.need_dx;
  Shape out{in[0], in[1], desc_.out_h(), desc_.out_w()};
  out_ = OutputBuffer(backend_, opts, out, DType::kF32, label() + " output");
  plan_.reset();  // Setup may run again (the graph planning its layouts again)
  ws_ = dx_buf_ = Tensor();
  if (fused_ != nullptr) {
    ws_ =
        SavedBuffer(backend_, opts, out, DType::kU8, label() + " window positions");  // a byte each
    return out;
  }
  plan_ = backend_.PreparePool(desc_);
  if (need_dx_) {
    dx_buf_ = InputGradBuffer(backend_, opts, 0, in, desc_.dx_bf16 ? DType::kBF16 : DType::kF32,
                              label() + " input gradient");
  }
  if (plan_->workspace_bytes > 0) {
    ws_ = SavedBuffer(backend_, opts, Shape{static_cast<int64_t>(plan_->workspace_bytes)},
                      DType::kU8, label() + " workspace");
  }
  return out;
}

const Tensor& Pool2d::Forward(const Tensor& x, const ForwardContext& ctx) {
  const int64_t n = x.shape()[0];
  if (fused_ == nullptr && (plan_ == nullptr || n != desc_.n)) {
    plan_.reset();  // as in Conv2d::PrepareFor: the old plan may have to go for the new to fit
    desc_.n = n;
    plan_ = backend_.PreparePool(desc_);
  }
  y_ = out_.Batch(n);
  have_ws_ = ctx.training && ws_.defined();
  if (fused_ != nullptr) {  // x is the convolution's input (Conv2d::Forward)
    backend_.ConvPoolForward(*fused_, x, fusion_.conv->weight(), fusion_.conv->bias(), &y_,
                             have_ws_ ? &ws_ : nullptr);
    return y_;
  }
  backend_.PoolForward(*plan_, x, &y_, have_ws_ ? &ws_ : nullptr);
  return y_;
}

const Tensor& Pool2d::Backward(const Tensor& dy, bool accumulate) {
  if (!need_dx_) return dx_;
  DPT_CHECK(have_ws_ || kind_ == PoolKind::kAvg) << "pool backward without a training forward";
  if (fused_ != nullptr) {  // the convolution's gradients; it wants no input gradient
    backend_.ConvPoolBackward(*fused_, fusion_.conv->input(), y_, dy, ws_,
                              fusion_.conv->weight_grad(), fusion_.conv->bias_grad(), accumulate);
    return dx_;
  }
  dx_ = dx_buf_.Batch(desc_.n);
  // dy gated by the output, written over it: every reader of the output has run its backward.
  if (fusion_.gate_relu) backend_.ReluBackward(y_, dy, &y_);
  backend_.PoolBackward(*plan_, fusion_.gate_relu ? y_ : dy, have_ws_ ? &ws_ : nullptr, &dx_);
  return dx_;
}

int64_t Pool2d::ActivationBytesPerSample() const {
  const int64_t out = desc_.c * desc_.out_h() * desc_.out_w();
  const int64_t in = desc_.c * desc_.h * desc_.w;
  const int64_t ws = ws_.defined() && desc_.n > 0 ? ws_.numel() / desc_.n : 0;
  if (fused_ != nullptr) return 4 * out + ws;  // no input: the convolution's output never exists
  return 4 * out + (need_dx_ ? (desc_.dx_bf16 ? 2 : 4) * in : 0) + ws;
}

}  // namespace dptrain
