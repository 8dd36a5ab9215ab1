// SPDX-License-Identifier: Apache-2.0
// Add, Mul and Concat layers.
#include "models/layers/join.h"

#include "core/error.h"
#include "models/layers/batch_norm.h"

namespace dptrain {
namespace {

[[noreturn]] void NeedsInputs(const Layer& l) {
  DPT_THROW(ConfigError) << "layer '" << l.label() << "' (" << l.type()
                         << ") joins several layers: give it inputs = [\"a\", \"b\", ...]";
}

}  // namespace

Shape Join::Setup(const Shape& /*in*/, const SetupOptions& /*opts*/) { NeedsInputs(*this); }
const Tensor& Join::Forward(const Tensor& /*x*/, const ForwardContext& /*ctx*/) {
  NeedsInputs(*this);
}
const Tensor& Join::Backward(const Tensor& /*dy*/, bool /*accumulate*/) { NeedsInputs(*this); }

namespace {

// Whether `s` is `w` with its (H, W) reduced to 1 x 1: a per-channel value of an image batch.
bool PerChannel(const Shape& s, const Shape& w) {
  return w.rank() == 4 && s.rank() == 4 && s[0] == w[0] && s[1] == w[1] && s[2] == 1 && s[3] == 1;
}

}  // namespace

bool Add::Broadcasts(const std::vector<Shape>& in, size_t* wide) {
  const size_t w = in.size() == 2 && in[1].numel() > in[0].numel() ? 1 : 0;
  if (wide != nullptr) *wide = w;
  return in.size() == 2 && PerChannel(in[1 - w], in[w]) && in[0] != in[1];
}

Shape Add::SetupInputs(const std::vector<Shape>& in, const SetupOptions& opts) {
  if (in.size() < 2) NeedsInputs(*this);
  broadcast_ = Broadcasts(in, &wide_);
  if (!broadcast_) {
    for (size_t k = 1; k < in.size(); ++k) {
      DPT_CHECK_AS(ConfigError, in[k] == in[0])
          << "layer '" << label() << "' (add): input " << k << " has shape " << in[k].ToString()
          << " but input 0 has " << in[0].ToString()
          << "; dptrain adds equal shapes, or (N, C, H, W) and (N, C, 1, 1)";
    }
  }
  // The broadcast sums (N, C) into (N, C, H, W) viewed as N * C rows: NCHW only (the layout pass
  // plans it so).
  DPT_CHECK(!broadcast_ || !opts.nhwc_in) << label() << ": a broadcast sum of channels-last inputs";
  inputs_ = in.size();
  need_dx_ = opts.need_dx;
  nhwc_ = opts.nhwc_in;
  const Shape& out = in[wide_];
  per_sample_ = out.numel() / out[0];
  rows_ = broadcast_ ? in[1 - wide_].numel() / in[1 - wide_][0] : 0;
  y_bf16_ = fusion_.y_bf16;
  const bool deferred =
      (fusion_.applies[0] != nullptr && fusion_.applies[0]->deferred_affine() != nullptr) ||
      (fusion_.applies[1] != nullptr && fusion_.applies[1]->deferred_affine() != nullptr);
  DPT_CHECK(!deferred || (!broadcast_ && inputs_ == 2))
      << label() << ": a deferred batch norm's sum";
  DPT_CHECK(!y_bf16_ || (deferred && fusion_.relu && need_dx_))
      << label() << ": a bf16 output without a batch norm to apply";
  flow_ = LayerFlow{};
  flow_.passes_gradient = !fusion_.relu;
  flow_.gradient_in_output = fusion_.relu && !y_bf16_;
  flow_.sums_gradient_parts = fusion_.relu && !broadcast_ && backend_.capabilities().gradient_parts;
  flow_.sums_sampled_part = flow_.sums_gradient_parts && nhwc_;
  out_ =
      OutputBuffer(backend_, opts, out, y_bf16_ ? DType::kBF16 : DType::kF32, label() + " output");
  // the gated gradient, which both inputs get (placed with the other input gradients)
  grad_buf_ = y_bf16_ ? InputGradBuffer(backend_, opts, kEveryInput, out, DType::kF32,
                                        label() + " input gradient")
                      : Tensor();
  if (broadcast_ && need_dx_) {
    narrow_buf_ = InputGradBuffer(backend_, opts, 1 - wide_, in[1 - wide_], DType::kF32,
                                  label() + " input gradient");
  }
  return out;
}

const Tensor& Add::ForwardInputs(const std::vector<const Tensor*>& x,
                                 const ForwardContext& /*ctx*/) {
  y_ = out_.Batch(x[0]->shape()[0]);
  const Tensor* a0 =
      fusion_.applies[0] != nullptr ? fusion_.applies[0]->deferred_affine() : nullptr;
  const Tensor* a1 =
      fusion_.applies[1] != nullptr ? fusion_.applies[1]->deferred_affine() : nullptr;
  if (a0 != nullptr || a1 != nullptr) {  // the batch norms' outputs, summed (and the ReLU)
    DPT_CHECK(!broadcast_ && x.size() == 2) << label() << ": a deferred batch norm's sum";
    backend_.AffineAdd(*x[0], a0, *x[1], a1, fusion_.relu, &y_);
    return y_;
  }
  DPT_CHECK(!y_bf16_) << label() << ": a bf16 output without a batch norm to apply";
  if (!broadcast_ && fusion_.relu && x.size() == 2) {
    backend_.AddRelu(*x[0], *x[1], &y_);  // a residual block's sum and ReLU in one pass
    return y_;
  }
  if (broadcast_) {
    backend_.AddRows(*x[wide_], *x[1 - wide_], &y_);
  } else {
    backend_.Add(*x[0], *x[1], &y_);
    for (size_t k = 2; k < x.size(); ++k) backend_.Add(y_, *x[k], &y_);
  }
  if (fusion_.relu) backend_.ReluForward(y_, &y_);
  return y_;
}

void Add::BackwardInputs(const Tensor& dy, bool /*accumulate*/, std::vector<const Tensor*>* dx) {
  // A folded ReLU gates dy over the output: its one reader (the ReLU's readers) has run its
  // backward, and the inputs' gradients may be that tensor itself until the next forward.
  const Tensor* g = &dy;
  if (fusion_.relu) {
    Tensor* gated = GateInto();
    backend_.ReluBackward(y_, dy, gated);
    g = gated;
  }
  dx->assign(inputs_, g);
  if (broadcast_) {
    if (need_dx_) {
      narrow_dx_ = narrow_buf_.Batch(dy.shape()[0]);
      backend_.RowSum(*g, &narrow_dx_);
    }
    (*dx)[1 - wide_] = &narrow_dx_;
  }
}

void Add::BackwardInputsSum(const Tensor& dy_a, const Tensor& dy_b, int64_t b_stride,
                            bool /*accumulate*/, std::vector<const Tensor*>* dx) {
  DPT_CHECK(fusion_.relu && !broadcast_)
      << label() << ": a gradient in two parts without a folded ReLU";
  DPT_CHECK(b_stride == 1 || nhwc_) << label() << ": a sampled gradient part of an NCHW sum";
  Tensor* gated = GateInto();
  backend_.ReluBackwardSum(y_, dy_a, dy_b, b_stride, gated);  // as BackwardInputs, of the sum
  dx->assign(inputs_, gated);
}

Tensor* Add::GateInto() {
  if (!y_bf16_) return &y_;  // over the output
  grad_ = grad_buf_.Batch(y_.shape()[0]);
  return &grad_;
}

Shape Mul::SetupInputs(const std::vector<Shape>& in, const SetupOptions& opts) {
  if (in.size() < 2) NeedsInputs(*this);
  DPT_CHECK_AS(ConfigError, in.size() == 2)
      << "layer '" << label() << "' (mul) multiplies exactly two inputs, got " << in.size();
  wide_ = in[1].numel() > in[0].numel() ? 1 : 0;
  const Shape& w = in[wide_];
  const Shape& s = in[1 - wide_];
  DPT_CHECK_AS(ConfigError, s == w || PerChannel(s, w))
      << "layer '" << label() << "' (mul): inputs of shapes " << in[0].ToString() << " and "
      << in[1].ToString() << "; dptrain multiplies equal shapes, or (N, C, H, W) by (N, C, 1, 1)";
  need_dx_ = opts.need_dx;
  rows_ = s.numel() / s[0];
  per_sample_ = w.numel() / w[0];
  out_ = OutputBuffer(backend_, opts, w, DType::kF32, label() + " output");
  if (need_dx_) {
    for (size_t k = 0; k < 2; ++k) {
      dx_buf_[k] =
          InputGradBuffer(backend_, opts, k, in[k], DType::kF32, label() + " input gradient");
    }
  }
  return w;
}

const Tensor& Mul::ForwardInputs(const std::vector<const Tensor*>& x,
                                 const ForwardContext& /*ctx*/) {
  x_[0] = *x[0];
  x_[1] = *x[1];
  y_ = out_.Batch(x[0]->shape()[0]);
  backend_.MulRows(x_[wide_], x_[1 - wide_], &y_);
  return y_;
}

void Mul::BackwardInputs(const Tensor& dy, bool /*accumulate*/, std::vector<const Tensor*>* dx) {
  dx->clear();
  if (need_dx_) {
    const size_t narrow = 1 - wide_;
    const int64_t n = dy.shape()[0];
    for (size_t k = 0; k < 2; ++k) dx_[k] = dx_buf_[k].Batch(n);
    backend_.MulRows(dy, x_[narrow], &dx_[wide_]);
    if (rows_ == per_sample_) {
      backend_.MulRows(dy, x_[wide_], &dx_[narrow]);
    } else {
      backend_.RowDot(dy, x_[wide_], &dx_[narrow]);
    }
  }
  dx->push_back(&dx_[0]);
  dx->push_back(&dx_[1]);
}

int64_t Mul::ActivationBytesPerSample() const {
  return 4 * (per_sample_ + (need_dx_ ? per_sample_ + rows_ : 0));
}

Shape Concat::SetupInputs(const std::vector<Shape>& in, const SetupOptions& opts) {
  if (in.size() < 2) NeedsInputs(*this);
  std::vector<int64_t> dims = in[0].dims();
  DPT_CHECK_AS(ConfigError, dims.size() >= 2)
      << "layer '" << label() << "' (concat): inputs of shape " << in[0].ToString()
      << " have no channel axis";
  for (size_t k = 1; k < in.size(); ++k) {
    std::vector<int64_t> d = in[k].dims();
    const bool same_rest = d.size() == dims.size() && [&] {
      for (size_t a = 0; a < d.size(); ++a) {
        if (a != 1 && d[a] != dims[a]) return false;
      }
      return true;
    }();
    DPT_CHECK_AS(ConfigError, same_rest)
        << "layer '" << label() << "' (concat): input " << k << " has shape " << in[k].ToString()
        << " but input 0 has " << in[0].ToString()
        << "; concatenated tensors may differ only in their channels (dimension 1)";
    dims[1] += d[1];
  }
  Shape out(dims);
  need_dx_ = opts.need_dx;
  widths_.clear();
  for (const Shape& s : in) widths_.push_back(s.numel() / s[0]);
  per_sample_ = out.numel() / out[0];
  out_ = OutputBuffer(backend_, opts, out, DType::kF32, label() + " output");
  dx_buf_.clear();
  dx_.assign(in.size(), Tensor());
  if (need_dx_) {
    for (size_t k = 0; k < in.size(); ++k) {
      dx_buf_.push_back(
          InputGradBuffer(backend_, opts, k, in[k], DType::kF32, label() + " input gradient"));
    }
  }
  return out;
}

const Tensor& Concat::ForwardInputs(const std::vector<const Tensor*>& x,
                                    const ForwardContext& /*ctx*/) {
  y_ = out_.Batch(x[0]->shape()[0]);
  int64_t col = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    backend_.CopyColumns(*x[k], 0, &y_, col, widths_[k]);
    col += widths_[k];
  }
  return y_;
}

void Concat::BackwardInputs(const Tensor& dy, bool /*accumulate*/, std::vector<const Tensor*>* dx) {
  dx->clear();
  int64_t col = 0;
  for (size_t k = 0; k < widths_.size(); ++k) {
    if (need_dx_) {
      dx_[k] = dx_buf_[k].Batch(dy.shape()[0]);
      backend_.CopyColumns(dy, col, &dx_[k], 0, widths_[k]);
    }
    dx->push_back(&dx_[k]);
    col += widths_[k];
  }
}

int64_t Concat::ActivationBytesPerSample() const { return 4 * (need_dx_ ? 2 : 1) * per_sample_; }

}  // namespace dptrain
