// SPDX-License-Identifier: Apache-2.0
// For backend implementations only: Backend::Run (core/ops.h) by the backend's own method of each
// op's name. RunOp(*this, op) in B::Run. Every op is B's own method (checked at compile time: a
// method B only inherits would be Backend's, which calls Run again), except the fusions a backend
// may leave out (the optional ones below): where B has none, they are an InternalError naming the
// backend, as Backend::Supports and the capability queries tell callers beforehand.
#pragma once

#include <memory>
#include <variant>

#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"

namespace dptrain {

template <class B>
void RunOp(B& be, const Op& op) {
  // Required: every backend runs these.
  static_assert(
      DeclaredBy<B>(&B::Zero) && DeclaredBy<B>(&B::Fill) && DeclaredBy<B>(&B::Scale) &&
          DeclaredBy<B>(&B::CopyColumns) && DeclaredBy<B>(&B::ReluForward) &&
          DeclaredBy<B>(&B::ReluBackward) && DeclaredBy<B>(&B::ActivationForward) &&
          DeclaredBy<B>(&B::ActivationBackward) && DeclaredBy<B>(&B::Add) &&
          DeclaredBy<B>(&B::AddRelu) && DeclaredBy<B>(&B::MulRows) && DeclaredBy<B>(&B::RowDot) &&
          DeclaredBy<B>(&B::AddRows) && DeclaredBy<B>(&B::RowSum) && DeclaredBy<B>(&B::Pad2d) &&
          DeclaredBy<B>(&B::ToChannelsLast) && DeclaredBy<B>(&B::FromChannelsLast) &&
          DeclaredBy<B>(&B::DropoutForward) && DeclaredBy<B>(&B::DropoutBackward) &&
          DeclaredBy<B>(&B::BatchNormForwardTraining) &&
          DeclaredBy<B>(&B::BatchNormForwardInference) && DeclaredBy<B>(&B::BatchNormBackward) &&
          DeclaredBy<B>(&B::SoftmaxCrossEntropy) &&
          DeclaredBy<B>(&B::SoftmaxCrossEntropyBackward) && DeclaredBy<B>(&B::MseLoss) &&
          DeclaredBy<B>(&B::MseBackward) && DeclaredBy<B>(&B::SgdStep) &&
          DeclaredBy<B>(&B::AdamWStep),
      "a backend implements every required op of core/ops.h itself");
  // Optional: the fusions (ConvPoolDesc, a gradient in two parts, a batch norm applied by its
  // reader), where Supports / TakesGradientParts / DefersBatchNormApply say yes.
  const auto none = [&](const char* what) {
    DPT_THROW(InternalError) << be.name() << ": no " << what;
  };
  std::visit(Cases{
                 [&](const op::Zero& o) { be.Zero(o.t); },
                 [&](const op::Fill& o) { be.Fill(o.t, o.value); },
                 [&](const op::Scale& o) { be.Scale(o.t, o.alpha); },
                 [&](const op::CopyColumns& o) {
                   be.CopyColumns(o.src, o.src_col, o.dst, o.dst_col, o.cols);
                 },
                 [&](const op::Relu& o) { be.ReluForward(o.x, o.y); },
                 [&](const op::ReluBackward& o) { be.ReluBackward(o.y, o.dy, o.dx); },
                 [&](const op::ReluBackwardSum& o) {
                   if constexpr (DeclaredBy<B>(&B::ReluBackwardSum)) {
                     be.ReluBackwardSum(o.y, o.dy_a, o.dy_b, o.b_stride, o.dx);
                   } else {
                     none("ReLU backward of a gradient in two parts");
                   }
                 },
                 [&](const op::Activation& o) { be.ActivationForward(o.f, o.x, o.y); },
                 [&](const op::ActivationBackward& o) {
                   be.ActivationBackward(o.f, o.x, o.y, o.dy, o.dx);
                 },
                 [&](const op::Add& o) { be.Add(o.a, o.b, o.y); },
                 [&](const op::AddRelu& o) { be.AddRelu(o.a, o.b, o.y); },
                 [&](const op::AffineAdd& o) {
                   if constexpr (DeclaredBy<B>(&B::AffineAdd)) {
                     be.AffineAdd(o.x0, o.affine0, o.x1, o.affine1, o.relu, o.y);
                   } else {
                     none("batch norm applied by its reader");
                   }
                 },
                 [&](const op::MulRows& o) { be.MulRows(o.x, o.s, o.y); },
                 [&](const op::RowDot& o) { be.RowDot(o.dy, o.x, o.ds); },
                 [&](const op::AddRows& o) { be.AddRows(o.x, o.s, o.y); },
                 [&](const op::RowSum& o) { be.RowSum(o.dy, o.ds); },
                 [&](const op::Pad2d& o) { be.Pad2d(o.x, o.top, o.left, o.y); },
                 [&](const op::ToChannelsLast& o) { be.ToChannelsLast(o.x, o.y); },
                 [&](const op::FromChannelsLast& o) { be.FromChannelsLast(o.x, o.y); },
                 [&](const op::Dropout& o) { be.DropoutForward(o.x, o.p, o.seed, o.y); },
                 [&](const op::DropoutBackward& o) { be.DropoutBackward(o.dy, o.p, o.seed, o.dx); },
                 [&](const op::BatchNormTraining& o) {
                   be.BatchNormForwardTraining(o.a, o.x, o.gamma, o.beta, o.running_mean,
                                               o.running_var, o.y, o.save_mean, o.save_invstd);
                 },
                 [&](const op::BatchNormInference& o) {
                   be.BatchNormForwardInference(o.a, o.x, o.gamma, o.beta, o.running_mean,
                                                o.running_var, o.y);
                 },
                 [&](const op::BatchNormBackward& o) {
                   be.BatchNormBackward(o.a, o.x, o.dy, o.relu_y, o.gamma, o.beta, o.save_mean,
                                        o.save_invstd, o.dx, o.dgamma, o.dbeta, o.accumulate);
                 },
                 [&](const op::BatchNormBackwardSum& o) {
                   if constexpr (DeclaredBy<B>(&B::BatchNormBackwardSum)) {
                     be.BatchNormBackwardSum(o.a, o.x, o.dy_a, o.dy_b, o.relu_y, o.gamma, o.beta,
                                             o.save_mean, o.save_invstd, o.dx, o.dgamma, o.dbeta,
                                             o.accumulate);
                   } else {
                     none("batch norm backward of a gradient in two parts");
                   }
                 },
                 [&](const op::BatchNormAffineTraining& o) {
                   if constexpr (DeclaredBy<B>(&B::BatchNormAffineTraining)) {
                     be.BatchNormAffineTraining(o.a, o.x, o.gamma, o.beta, o.running_mean,
                                                o.running_var, o.affine, o.save_mean,
                                                o.save_invstd);
                   } else {
                     none("batch norm applied by its reader");
                   }
                 },
                 [&](const op::BatchNormAffineInference& o) {
                   if constexpr (DeclaredBy<B>(&B::BatchNormAffineInference)) {
                     be.BatchNormAffineInference(o.a, o.gamma, o.beta, o.running_mean,
                                                 o.running_var, o.affine);
                   } else {
                     none("batch norm applied by its reader");
                   }
                 },
                 [&](const op::ConvPoolForward& o) {
                   if constexpr (DeclaredBy<B>(&B::ConvPoolForward)) {
                     be.ConvPoolForward(o.d, o.x, o.w, o.b, o.y, o.ws);
                   } else {
                     none(("fused " + o.d.ToString()).c_str());
                   }
                 },
                 [&](const op::ConvPoolBackward& o) {
                   if constexpr (DeclaredBy<B>(&B::ConvPoolBackward)) {
                     be.ConvPoolBackward(o.d, o.x, o.y, o.dy, o.ws, o.dw, o.db, o.accumulate);
                   } else {
                     none(("fused " + o.d.ToString()).c_str());
                   }
                 },
                 [&](const op::SoftmaxCrossEntropy& o) {
                   be.SoftmaxCrossEntropy(o.logits, o.labels, o.label_smoothing, o.probs,
                                          o.loss_sum, o.correct);
                 },
                 [&](const op::SoftmaxCrossEntropyBackward& o) {
                   be.SoftmaxCrossEntropyBackward(o.probs, o.labels, o.label_smoothing, o.scale,
                                                  o.dlogits);
                 },
                 [&](const op::Mse& o) { be.MseLoss(o.y, o.t, o.loss_sum); },
                 [&](const op::MseBackward& o) { be.MseBackward(o.y, o.t, o.scale, o.dy); },
                 [&](const op::SgdStep& o) { be.SgdStep(o.h, o.param, o.grad, o.momentum); },
                 [&](const op::AdamWStep& o) { be.AdamWStep(o.h, o.param, o.grad, o.m, o.v); },
             },
             op);
}

// For backend implementations only: the planned entry (Backend::Supports(PlanDesc), Prepare,
// Run(plan, op)) by the backend's own methods of each family: SupportsPlanned(*this, d),
// PrepareOp(*this, d), RunPlannedOp(*this, plan, op). Every planned op is required: a backend
// declares Supports, Prepare* and the runs of each family itself.
template <class B>
bool SupportsPlanned(const B& be, const PlanDesc& d) {
  static_assert(DeclaredBy<B>(static_cast<bool (B::*)(const PoolDesc&) const>(&B::Supports)),
                "a backend answers Supports for every planned op itself");
  return std::visit(Cases{[&](const PoolDesc& p) { return be.Supports(p); }}, d);
}

template <class B>
std::shared_ptr<OpPlan> PrepareOp(B& be, const PlanDesc& d) {
  static_assert(DeclaredBy<B>(&B::PreparePool), "a backend prepares every planned op itself");
  return std::visit(Cases{[&](const PoolDesc& p) { return be.PreparePool(p); }}, d);
}

template <class B>
void RunPlannedOp(B& be, const OpPlan& plan, const PlannedOp& op) {
  static_assert(DeclaredBy<B>(&B::PoolForward) && DeclaredBy<B>(&B::PoolBackward),
                "a backend runs every planned op itself");
  std::visit(Cases{
                 [&](const op::PoolForward& o) { be.PoolForward(plan, o.x, o.y, o.ws); },
                 [&](const op::PoolBackward& o) { be.PoolBackward(plan, o.dy, o.ws, o.dx); },
             },
             op);
}

}  // namespace dptrain
