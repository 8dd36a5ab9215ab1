// SPDX-License-Identifier: Apache-2.0
// The op-generic entry of the Backend seam (Backend::Run): every op that needs no plan of its own
// is a small struct here, holding its tensors and scalar arguments, and one of the alternatives of
// `Op`. A backend implements Run once, with a case for each alternative (std::visit: a backend
// that misses one does not compile), instead of a virtual method per op. Adding an op: a struct
// here and in `Op`, its case in each backend's Run (core/cpu/cpu_backend.cc,
// core/cuda/cuda_backend.cc), a conformance case against the CPU reference
// (docs/adding-ops.md). Backend's named methods (ReluForward, Add, ...) build these and call Run;
// their contracts are documented there.
#pragma once

#include <cstdint>
#include <type_traits>
#include <variant>

#include "core/elementwise.h"
#include "core/tensor.h"

namespace dptrain {

struct BatchNormArgs;
struct ConvPoolDesc;

namespace op {

// ---- memory ----
struct Zero {
  Tensor* t;
};
struct Fill {
  Tensor* t;
  float value;
};
struct Scale {
  Tensor* t;
  float alpha;
};
struct CopyColumns {
  const Tensor& src;
  int64_t src_col;
  Tensor* dst;
  int64_t dst_col, cols;
};

// ---- elementwise ----
struct Relu {
  const Tensor& x;
  Tensor* y;
};
struct ReluBackward {
  const Tensor &y, &dy;
  Tensor* dx;
};
struct ReluBackwardSum {
  const Tensor &y, &dy_a, &dy_b;
  int64_t b_stride;
  Tensor* dx;
};
struct Activation {
  const ew::Activation& f;
  const Tensor& x;
  Tensor* y;
};
struct ActivationBackward {
  const ew::Activation& f;
  const Tensor &x, &y, &dy;
  Tensor* dx;
};
struct Add {
  const Tensor &a, &b;
  Tensor* y;
};
struct AddRelu {
  const Tensor &a, &b;
  Tensor* y;
};
struct AffineAdd {
  const Tensor& x0;
  const Tensor* affine0;
  const Tensor& x1;
  const Tensor* affine1;
  bool relu;
  Tensor* y;
};
struct MulRows {
  const Tensor &x, &s;
  Tensor* y;
};
struct RowDot {
  const Tensor &dy, &x;
  Tensor* ds;
};
struct AddRows {
  const Tensor &x, &s;
  Tensor* y;
};
struct RowSum {
  const Tensor& dy;
  Tensor* ds;
};
struct Pad2d {
  const Tensor& x;
  int64_t top, left;
  Tensor* y;
};
struct ToChannelsLast {
  const Tensor& x;
  Tensor* y;
};
struct FromChannelsLast {
  const Tensor& x;
  Tensor* y;
};
struct Dropout {
  const Tensor& x;
  float p;
  uint64_t seed;
  Tensor* y;
};
struct DropoutBackward {
  const Tensor& dy;
  float p;
  uint64_t seed;
  Tensor* dx;
};

// ---- batch norm ----
struct BatchNormTraining {
  const BatchNormArgs& a;
  const Tensor &x, &gamma, &beta;
  Tensor *running_mean, *running_var, *y, *save_mean, *save_invstd;
};
struct BatchNormInference {
  const BatchNormArgs& a;
  const Tensor &x, &gamma, &beta, &running_mean, &running_var;
  Tensor* y;
};
struct BatchNormBackward {
  const BatchNormArgs& a;
  const Tensor &x, &dy;
  const Tensor* relu_y;
  const Tensor &gamma, &beta, &save_mean, &save_invstd;
  Tensor *dx, *dgamma, *dbeta;
  bool accumulate;
};
struct BatchNormBackwardSum {
  const BatchNormArgs& a;
  const Tensor &x, &dy_a, &dy_b;
  const Tensor* relu_y;
  const Tensor &gamma, &beta, &save_mean, &save_invstd;
  Tensor *dx, *dgamma, *dbeta;
  bool accumulate;
};
struct BatchNormAffineTraining {
  const BatchNormArgs& a;
  const Tensor &x, &gamma, &beta;
  Tensor *running_mean, *running_var, *affine, *save_mean, *save_invstd;
};
struct BatchNormAffineInference {
  const BatchNormArgs& a;
  const Tensor &gamma, &beta, &running_mean, &running_var;
  Tensor* affine;
};

// ---- convolution + ReLU + 2x2 max pool (ConvPoolDesc) ----
struct ConvPoolForward {
  const ConvPoolDesc& d;
  const Tensor &x, &w;
  const Tensor* b;
  Tensor *y, *ws;
};
struct ConvPoolBackward {
  const ConvPoolDesc& d;
  const Tensor &x, &y, &dy, &ws;
  Tensor *dw, *db;
  bool accumulate;
};

// ---- losses ----
struct SoftmaxCrossEntropy {
  const Tensor &logits, &labels;
  float label_smoothing;
  Tensor *probs, *loss_sum, *correct;
};
struct SoftmaxCrossEntropyBackward {
  const Tensor &probs, &labels;
  float label_smoothing, scale;
  Tensor* dlogits;
};
struct Mse {
  const Tensor &y, &t;
  Tensor* loss_sum;
};
struct MseBackward {
  const Tensor &y, &t;
  float scale;
  Tensor* dy;
};

// ---- optimizer updates ----
struct SgdStep {
  const ew::SgdHyper& h;
  Tensor* param;
  const Tensor& grad;
  Tensor* momentum;
};
struct AdamWStep {
  const ew::AdamWHyper& h;
  Tensor* param;
  const Tensor& grad;
  Tensor *m, *v;
};

// ---- planned ops (Backend::Run(plan, op), planned by Backend::Prepare(PlanDesc)) ----
struct PoolForward {
  const Tensor& x;
  Tensor* y;
  Tensor* ws;
};
struct PoolBackward {
  const Tensor& dy;
  const Tensor* ws;
  Tensor* dx;
};

}  // namespace op

// The ops run with a plan (Backend::Run(const OpPlan&, const PlannedOp&)); their descriptors are
// core/backend.h's PlanDesc.
using PlannedOp = std::variant<op::PoolForward, op::PoolBackward>;

using Op =
    std::variant<op::Zero, op::Fill, op::Scale, op::CopyColumns, op::Relu, op::ReluBackward,
                 op::ReluBackwardSum, op::Activation, op::ActivationBackward, op::Add, op::AddRelu,
                 op::AffineAdd, op::MulRows, op::RowDot, op::AddRows, op::RowSum, op::Pad2d,
                 op::ToChannelsLast, op::FromChannelsLast, op::Dropout, op::DropoutBackward,
                 op::BatchNormTraining, op::BatchNormInference, op::BatchNormBackward,
                 op::BatchNormBackwardSum, op::BatchNormAffineTraining,
                 op::BatchNormAffineInference, op::ConvPoolForward, op::ConvPoolBackward,
                 op::SoftmaxCrossEntropy, op::SoftmaxCrossEntropyBackward, op::Mse, op::MseBackward,
                 op::SgdStep, op::AdamWStep>;

// Whether `m` is a member function that class B declares itself, not one it inherits: a case of
// B::Run that calls B's own ReluForward must not reach Backend::ReluForward (which calls Run).
template <class B, class C, class R, class... A>
constexpr bool DeclaredBy(R (C::*)(A...)) {
  return std::is_same_v<B, C>;
}
template <class B, class C, class R, class... A>
constexpr bool DeclaredBy(R (C::*)(A...) const) {
  return std::is_same_v<B, C>;
}

// For a backend's Run: std::visit(Cases{[&](const op::Relu& o) {...}, ...}, op).
template <class... F>
struct Cases : F... {
  using F::operator()...;
};
template <class... F>
Cases(F...) -> Cases<F...>;

}  // namespace dptrain
