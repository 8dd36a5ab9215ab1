// SPDX-License-Identifier: Apache-2.0
// Linear layer over the backend's inner-product op.
#include "models/layers/linear.h"

#include "core/error.h"

namespace dptrain {

Linear::Linear(Backend& be, std::string name, int64_t out_features, bool bias)
    : Layer(be, std::move(name)), out_features_(out_features), bias_(bias) {}

Shape Linear::Setup(const Shape& in, const SetupOptions& opts) {
  DPT_CHECK_AS(ConfigError, in.rank() == 2)
      << "linear '" << name_ << "' needs (N, features) input, got " << in.ToString()
      << "; hint: put a flatten layer before it";
  desc_ = LinearDesc{in[0], in[1], out_features_, bias_, opts.precision};
  if (!backend_.Supports(desc_)) {
    DPT_THROW(UnsupportedError) << "the " << backend_.name() << " backend does not support "
                                << desc_.ToString() << " (layer '" << label()
                                << "'); hint: on CPU use train.precision = \"fp32\" or \"bf16\"";
  }
  need_dx_ = opts.need_dx;
  plan_.reset();  // a cached plan counts the layers holding it (one staged input each)
  plan_ = backend_.PrepareLinear(desc_);
  Shape out{in[0], out_features_};
  out_ = OutputBuffer(backend_, opts, out, DType::kF32, label() + " output");
  if (need_dx_)
    dx_buf_ = InputGradBuffer(backend_, opts, 0, in, DType::kF32, label() + " input gradient");
  return out;
}

void Linear::ListParams(std::vector<ParamRef>* out) {
  out->push_back(
      {"weight", Shape{out_features_, desc_.in}, Init::kFanInUniform, desc_.in, &w_, &gw_});
  if (bias_)
    out->push_back({"bias", Shape{out_features_}, Init::kFanInUniform, desc_.in, &b_, &gb_});
}

const Tensor& Linear::Forward(const Tensor& x, const ForwardContext& /*ctx*/) {
  const int64_t n = x.shape()[0];
  if (plan_ == nullptr || n != desc_.n) {
    plan_.reset();  // as in Conv2d::PrepareFor: the old plan may have to go for the new to fit
    desc_.n = n;
    plan_ = backend_.PrepareLinear(desc_);
  }
  x_ = x;
  y_ = out_.Batch(n);
  backend_.LinearForward(*plan_, x, w_, bias_ ? &b_ : nullptr, &y_);
  return y_;
}

const Tensor& Linear::Backward(const Tensor& dy, bool accumulate) {
  if (need_dx_) dx_ = dx_buf_.Batch(desc_.n);
  backend_.LinearBackward(*plan_, x_, dy, w_, need_dx_ ? &dx_ : nullptr, &gw_,
                          bias_ ? &gb_ : nullptr, accumulate);
  return dx_;
}

int64_t Linear::ActivationBytesPerSample() const {
  return 4 * (out_features_ + (need_dx_ ? desc_.in : 0));
}

}  // namespace dptrain
