// SPDX-License-Identifier: Apache-2.0
// Flatten and Reshape layers.
#include "models/layers/flatten.h"

#include <string>

#include "core/error.h"

namespace dptrain {

Shape Flatten::Setup(const Shape& in, const SetupOptions& opts) {
  in_ = in;
  // The output is (N, features) in NCHW order whatever opts.nhwc_out says: the graph asks for
  // NHWC only when every reader takes it, a convolution or a global pool, and those refuse a
  // 2-D input at their own Setup (a model.layers mistake, reported there).
  // One channel or one position (a global pool's (N, C, 1, 1)) is the same bytes in both
  // layouts: a view, as NCHW.
  transpose_ = opts.nhwc_in && in.rank() == 4 && in[1] > 1 && in[2] * in[3] > 1;
  flow_ = LayerFlow{};
  flow_.passes_gradient = flow_.forward_passes_input = !transpose_;  // views of dy and x
  if (transpose_) {
    out_ = OutputBuffer(backend_, opts, in, DType::kF32, label() + " output (NCHW order)");
    if (opts.need_dx)
      dx_buf_ = InputGradBuffer(backend_, opts, 0, in, DType::kF32, label() + " input gradient");
  }
  return Shape{in[0], in.numel() / in[0]};
}

const Tensor& Flatten::Forward(const Tensor& x, const ForwardContext& /*ctx*/) {
  const int64_t n = x.shape()[0];
  if (!transpose_) {
    y_ = x.View(Shape{n, x.numel() / n});
    return y_;
  }
  Tensor nchw = out_.Batch(n);
  backend_.FromChannelsLast(x, &nchw);
  y_ = nchw.View(Shape{n, x.numel() / n});
  return y_;
}

const Tensor& Flatten::Backward(const Tensor& dy, bool /*accumulate*/) {
  const int64_t n = dy.shape()[0];
  if (!transpose_) {
    dx_ = dy.View(in_.WithBatch(n));
    return dx_;
  }
  if (dx_buf_.defined()) {
    dx_ = dx_buf_.Batch(n);
    backend_.ToChannelsLast(dy.View(in_.WithBatch(n)), &dx_);
  }
  return dx_;
}

int64_t Flatten::ActivationBytesPerSample() const {
  if (!transpose_) return 0;
  return 4 * (in_.numel() / in_[0]) * (dx_buf_.defined() ? 2 : 1);
}

Shape Reshape::Setup(const Shape& in, const SetupOptions& /*opts*/) {
  in_ = in;
  flow_.passes_gradient = flow_.forward_passes_input = true;  // views of dy and x
  const int64_t per_sample = in.numel() / in[0];
  std::vector<int64_t> out{in[0]};
  int64_t known = 1, infer = -1;
  std::string want = "[N";
  for (size_t i = 0; i < dims_.size(); ++i) {
    int64_t d = dims_[i];
    want += ", " + std::to_string(d);
    if (d == 0) {
      DPT_CHECK_AS(ConfigError, static_cast<int>(i) + 1 < in.rank())
          << "reshape '" << label() << "': 0 at place " << i + 1 << " copies a dimension that "
          << in.ToString() << " does not have";
      d = in[static_cast<int>(i) + 1];
    }
    if (d == -1) {
      DPT_CHECK_AS(ConfigError, infer < 0) << "reshape '" << label() << "': more than one -1";
      infer = static_cast<int64_t>(out.size());
    } else {
      DPT_CHECK_AS(ConfigError, d > 0)
          << "reshape '" << label() << "': dimension " << d << " is not a size";
      known *= d;
    }
    out.push_back(d);
  }
  want += "]";
  if (infer >= 0 && known > 0 && per_sample % known == 0)
    out[static_cast<size_t>(infer)] = per_sample / known;
  out_ = Shape(out);
  DPT_CHECK_AS(ConfigError, out_.numel() == in.numel())
      << "reshape '" << label() << "': cannot view " << in.ToString() << " as " << want;
  return out_;
}

const Tensor& Reshape::Forward(const Tensor& x, const ForwardContext& /*ctx*/) {
  y_ = x.View(out_.WithBatch(x.shape()[0]));
  return y_;
}

const Tensor& Reshape::Backward(const Tensor& dy, bool /*accumulate*/) {
  dx_ = dy.View(in_.WithBatch(dy.shape()[0]));
  return dx_;
}

}  // namespace dptrain
