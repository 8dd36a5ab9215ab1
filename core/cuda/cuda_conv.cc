// SPDX-License-Identifier: Apache-2.0
// CUDA backend: conv2d on cuDNN's descriptor ("legacy") API, planned once per shape, precision
// and operand layout (descriptors, algorithms, workspace, staging) and cached. cuDNN reads and
// writes the caller's tensors as they are where they are in the plan's compute type and layout
// (channels-last activations from the graph's layout pass, bf16 ones from its hand-offs); the
// others are converted into staging buffers and back (kernels::Convert), the bias and a folded
// ReLU added on the way out. The bias gradient on cuDNN (NCHW) or as column sums (NHWC). The
// algorithm search is in cuda_conv_algo.cc.
#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_conv_impl.h"
#include "core/cuda/kernels.h"
#include "core/error.h"

namespace dptrain::cuda {
namespace {

// Whether a tensor of element type et and layout nhwc is one cuDNN reads or writes as it is (else
// through staging: Stage, Unstage).
bool Direct(const ConvPlan& p, kernels::Elem et, bool nhwc) { return et == p.ct && nhwc == p.nhwc; }

// The operand t (planes, c, hw) of element type et and layout nhwc as cuDNN reads it: t itself
// where it is in the plan's compute type and layout already, else converted into `staging`.
const void* Stage(const ConvPlan& p, const Tensor& t, kernels::Elem et, bool nhwc,
                  const Tensor& staging, int64_t planes, int64_t c, int64_t hw, cudaStream_t s) {
  if (Direct(p, et, nhwc)) return t.raw();
  kernels::Convert(t.raw(), et, nhwc, staging.raw(), p.ct, p.nhwc, nullptr, false, false, planes, c,
                   hw, s);
  return staging.raw();
}

// A result cuDNN wrote into `staging` into t (element type et, layout nhwc), with the bias b
// (nullable) and a folded ReLU, or added into t (accumulate; then neither b nor relu).
void Unstage(const ConvPlan& p, const Tensor& staging, const float* b, bool relu, bool accumulate,
             Tensor* t, kernels::Elem et, bool nhwc, int64_t planes, int64_t c, int64_t hw,
             cudaStream_t s) {
  kernels::Convert(staging.raw(), p.ct, p.nhwc, t->raw(), et, nhwc, b, relu, accumulate, planes, c,
                   hw, s);
}

}  // namespace

std::shared_ptr<OpPlan> CudaBackend::PrepareConv2d(const Conv2dDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cuda: conv2d " << d.ToString();
  std::lock_guard<std::mutex> lock(mu_);
  const int layouts = (d.x_nhwc ? 1 : 0) | (d.y_nhwc ? 2 : 0) | (d.x_bf16 ? 4 : 0) |
                      (d.y_bf16 ? 8 : 0) | (d.dy_bf16 ? 16 : 0);
  auto& slot = conv_plans_[std::make_tuple(d.n, d.c, d.h, d.w, d.k, d.r, d.s, d.stride, d.pad,
                                           d.bias, static_cast<int>(d.precision), d.groups,
                                           d.dilation, d.relu, layouts)];
  if (slot) return slot;
  MakeCurrent();
  auto p = std::make_shared<ConvPlan>();
  p->d = d;
  p->half = IsHalf(d.precision);
  p->tf32 = !p->half && tf32_;
  p->kind = HalfKind(d.precision);
  p->ct = p->half ? kernels::ElemOf(p->kind) : kernels::Elem::kF32;
  const cudnnDataType_t dt = !p->half                          ? CUDNN_DATA_FLOAT
                             : d.precision == Precision::kBF16 ? CUDNN_DATA_BFLOAT16
                                                               : CUDNN_DATA_HALF;
  const int64_t P = d.out_h(), Q = d.out_w();
  p->y32.Set(CUDNN_DATA_FLOAT, d.n, d.k, P, Q);
  p->b32.Set(CUDNN_DATA_FLOAT, 1, d.k, 1, 1);
  // Cross-correlation (no kernel flip), as PyTorch's Conv2d; f32 accumulation in every precision.
  // fp32: FMA-only kernels, or with train.tf32 CUDNN_DEFAULT_MATH, which lets cuDNN run TF32 on
  // tensor cores on Ampere and newer (unless NVIDIA_TF32_OVERRIDE=0), as PyTorch's default.
  const cudnnMathType_t math = p->half   ? CUDNN_TENSOR_OP_MATH
                               : p->tf32 ? CUDNN_DEFAULT_MATH
                                         : CUDNN_FMA_MATH;
  for (ConvDesc* c : {&p->fwd, &p->bwd_data, &p->bwd_filter}) {
    DPT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        c->d, static_cast<int>(d.pad), static_cast<int>(d.pad), static_cast<int>(d.stride),
        static_cast<int>(d.stride), static_cast<int>(d.dilation), static_cast<int>(d.dilation),
        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DPT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(c->d, static_cast<int>(d.groups)));
  }
  // The operands' descriptors in one layout, and the algorithms for it: cuDNN's heuristics (or
  // its timings), deterministic backward ones (cuda_conv_algo.cc). The descriptors keep the
  // logical (N, C, H, W) / (K, C, R, S) sizes; the format says how the buffers cuDNN reads lay
  // them out. A grouped filter is (K, C/G, R, S), as PyTorch's; the group count is on each
  // convolution descriptor.
  const size_t cap = std::min<size_t>(size_t{1} << 30, identity_.memory_total / 8);
  const auto plan_layout = [&](bool nhwc) {
    p->nhwc = nhwc;
    const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    p->x.Set(dt, d.n, d.c, d.h, d.w, format);
    p->y.Set(dt, d.n, d.k, P, Q, format);
    DPT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w.d, dt, format, static_cast<int>(d.k),
                                               static_cast<int>(d.group_c()), static_cast<int>(d.r),
                                               static_cast<int>(d.s)));
    for (ConvDesc* c : {&p->fwd, &p->bwd_data, &p->bwd_filter}) {
      DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(c->d, math));  // the choice below resets it
    }
    int on = 0, oc = 0, oh = 0, ow = 0;
    DPT_CUDNN_CHECK(
        cudnnGetConvolution2dForwardOutputDim(p->fwd.d, p->x.d, p->w.d, &on, &oc, &oh, &ow));
    DPT_CHECK(on == d.n && oc == d.k && oh == P && ow == Q)
        << "cuDNN computes output (" << on << "," << oc << "," << oh << "," << ow << ") for "
        << d.ToString();
    ChooseConvAlgorithms(cudnn_, p.get(), deterministic_, timed_search_, cap);
  };
  if (ComputesChannelsLast(d, p->half)) {
    try {
      plan_layout(true);
    } catch (const UnsupportedError&) {
      // No algorithm meets the rules in NHWC (train.deterministic = true on a GPU whose
      // deterministic kernels are NCHW only): the layout cuDNN has them for.
      plan_layout(false);
    } catch (const CudnnRefusal&) {
      // cuDNN refused the NHWC descriptors themselves (a query's NOT_SUPPORTED or BAD_PARAM on
      // this shape): NCHW. Any other cuDNN error (a failure while running) is thrown as it is.
      (void)cudaGetLastError();
      plan_layout(false);
    }
  } else {
    plan_layout(false);
  }
  ReserveWorkspace(std::max({p->fwd_ws, p->data_ws, p->filter_ws}));
  // NaN becomes 0, as ew::Relu (the ReLU kernels and the epilogue) does.
  DPT_CUDNN_CHECK(
      cudnnSetActivationDescriptor(p->relu.d, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  // Staging where a tensor the caller hands over is not in the compute type and layout: x (x_bf16)
  // or dx (f32, x's layout); y (y_bf16) or dy (dy_bf16), y's layout; the filter, f32 KCRS.
  const kernels::Elem f32 = kernels::Elem::kF32, bf16 = kernels::Elem::kBF16;
  const bool stage_x = !Direct(*p, d.x_bf16 ? bf16 : f32, d.x_nhwc) || !Direct(*p, f32, d.x_nhwc);
  const bool stage_y =
      !Direct(*p, d.y_bf16 ? bf16 : f32, d.y_nhwc) || !Direct(*p, d.dy_bf16 ? bf16 : f32, d.y_nhwc);
  const bool stage_w = !Direct(*p, f32, false);
  p->fused = d.relu && d.bias && !p->half && Direct(*p, f32, d.y_nhwc);
  const DType ct = p->half ? HalfDType(d.precision) : DType::kF32;
  if (stage_x) p->xs = Empty(Shape{d.n * d.c * d.h * d.w}, ct, "conv2d staged x/dx");
  if (stage_y) p->ys = Empty(Shape{d.n * d.k * P * Q}, ct, "conv2d staged y/dy");
  if (stage_w) p->ws = Empty(Shape{d.weight_numel()}, ct, "conv2d staged w/dw");
  // Counted by the memory plan (OpPlan::held_bytes), once per plan the layers of a shape share.
  for (const Tensor* t : {&p->xs, &p->ys, &p->ws}) p->held_bytes += t->defined() ? t->bytes() : 0;
  slot = p;
  return p;
}

void CudaBackend::Conv2dForward(const OpPlan& plan, const Tensor& x, const Tensor& w,
                                const Tensor* b, Tensor* y) {
  OpScope scope(this, "conv2d_fwd");
  const auto& p = static_cast<const ConvPlan&>(plan);
  const Conv2dDesc& d = p.d;
  scope.set_flops(d.flops());
  const kernels::Elem xt = ExpectElem(x, d.x_bf16, "conv2d x");
  const kernels::Elem yt = ExpectElem(*y, d.y_bf16, "conv2d y");
  CheckF32(w, "conv2d w");
  CheckNumel(x, d.n * d.c * d.h * d.w, "conv2d x", d);
  CheckNumel(w, d.weight_numel(), "conv2d w", d);
  CheckNumel(*y, d.n * d.k * d.out_h() * d.out_w(), "conv2d y", d);
  DPT_CHECK(!d.bias || b != nullptr) << "conv2d with bias needs a bias tensor";
  if (d.bias) {
    CheckF32(*b, "conv2d b");
    CheckNumel(*b, d.k, "conv2d b", d);
  }
  const float one = 1.f, zero = 0.f;
  const int64_t hw = d.h * d.w, pq = d.out_h() * d.out_w(), rs = d.r * d.s;
  const void* xin = Stage(p, x, xt, d.x_nhwc, p.xs, d.n, d.c, hw, stream_);
  const void* win = Stage(p, w, kernels::Elem::kF32, false, p.ws, d.k, d.group_c(), rs, stream_);
  const bool direct = Direct(p, yt, d.y_nhwc);
  void* yout = direct ? y->raw() : p.ys.raw();
  if (p.fused) {
    // y = relu(conv(x) + 0 * z + bias), z = y (not read with alpha2 = 0). The workspace is the
    // forward algorithm's own.
    const cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
        cudnn_, &one, p.x.d, xin, p.w.d, win, p.fwd.d, p.fwd_algo, Workspace(), p.fwd_ws, &zero,
        p.y.d, yout, p.b32.d, b->raw(), p.relu.d, p.y.d, yout);
    if (st == CUDNN_STATUS_SUCCESS) return;
    // cuDNN 9 reports sub-codes of NOT_SUPPORTED (shape, layout, ...) and, for some
    // combinations, of BAD_PARAM: either way the fused call is not for this plan, and the plain
    // call and the epilogue take over. Any other status is a failure and throws. The runtime's
    // error flag is cleared, so that no later launch check reports cuDNN's failure as its own.
    (void)cudaGetLastError();
    if (!detail::CudnnRefused(static_cast<int>(st))) {
      DPT_CUDNN_CHECK(st);
    }
    std::fprintf(stderr,
                 "%sdptrain: note: cuDNN's fused bias+ReLU convolution is not available for %s "
                 "(%s); running the convolution and its epilogue separately\n",
                 RankTag().c_str(), d.ToString().c_str(),
                 detail::CudnnStatusText(static_cast<int>(st)).c_str());
    p.fused = false;  // the epilogue from now on
  }
  DPT_CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, p.x.d, xin, p.w.d, win, p.fwd.d, p.fwd_algo,
                                          Workspace(), p.fwd_ws, &zero, p.y.d, yout));
  // Widening and the layout (from staging), bias and ReLU in one pass over the output; in place
  // where cuDNN wrote y itself.
  const float* bias = d.bias ? b->data<float>() : nullptr;
  if (!direct) {
    Unstage(p, p.ys, bias, d.relu, false, y, yt, d.y_nhwc, d.n, d.k, pq, stream_);
  } else if (bias != nullptr || d.relu) {
    kernels::Convert(y->raw(), yt, d.y_nhwc, y->raw(), yt, d.y_nhwc, bias, d.relu, false, d.n, d.k,
                     pq, stream_);
  }
}

void CudaBackend::Conv2dBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                     Tensor* dx) {
  OpScope scope(this, "conv2d_bwd_data");
  const auto& p = static_cast<const ConvPlan&>(plan);
  const Conv2dDesc& d = p.d;
  scope.set_flops(d.flops());
  const kernels::Elem dyt = ExpectElem(dy, d.dy_bf16, "conv2d dy");
  CheckF32(w, "conv2d w");
  CheckF32(*dx, "conv2d dx");
  CheckNumel(dy, d.n * d.k * d.out_h() * d.out_w(), "conv2d dy", d);
  CheckNumel(*dx, d.n * d.c * d.h * d.w, "conv2d dx", d);
  const float one = 1.f, zero = 0.f;
  const int64_t hw = d.h * d.w;
  const void* dyin = Stage(p, dy, dyt, d.y_nhwc, p.ys, d.n, d.k, d.out_h() * d.out_w(), stream_);
  const void* win =
      Stage(p, w, kernels::Elem::kF32, false, p.ws, d.k, d.group_c(), d.r * d.s, stream_);
  const bool direct = Direct(p, kernels::Elem::kF32, d.x_nhwc);
  void* dxout = direct ? dx->raw() : p.xs.raw();
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, p.w.d, win, p.y.d, dyin, p.bwd_data.d,
                                               p.data_algo, Workspace(), p.data_ws, &zero, p.x.d,
                                               dxout));
  if (!direct) {
    Unstage(p, p.xs, nullptr, false, false, dx, kernels::Elem::kF32, d.x_nhwc, d.n, d.c, hw,
            stream_);
  }
}

void CudaBackend::Conv2dBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                        Tensor* dw, Tensor* db, bool accumulate) {
  OpScope scope(this, "conv2d_bwd_weights");
  const auto& p = static_cast<const ConvPlan&>(plan);
  const Conv2dDesc& d = p.d;
  scope.set_flops(d.flops());
  const kernels::Elem xt = ExpectElem(x, d.x_bf16, "conv2d x");
  const kernels::Elem dyt = ExpectElem(dy, d.dy_bf16, "conv2d dy");
  CheckF32(*dw, "conv2d dw");
  CheckNumel(x, d.n * d.c * d.h * d.w, "conv2d x", d);
  CheckNumel(dy, d.n * d.k * d.out_h() * d.out_w(), "conv2d dy", d);
  CheckNumel(*dw, d.weight_numel(), "conv2d dw", d);
  const float one = 1.f, zero = 0.f;
  const int64_t pq = d.out_h() * d.out_w();
  const void* xin = Stage(p, x, xt, d.x_nhwc, p.xs, d.n, d.c, d.h * d.w, stream_);
  const void* dyin = Stage(p, dy, dyt, d.y_nhwc, p.ys, d.n, d.k, pq, stream_);
  // beta = 1 adds into the existing gradient (accumulation) where cuDNN writes dw itself; a staged
  // result is added when converted instead, so cuDNN never reads the staging buffer.
  const bool direct = Direct(p, kernels::Elem::kF32, false);
  void* dwout = direct ? dw->raw() : p.ws.raw();
  const float* beta = accumulate && direct ? &one : &zero;
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, p.x.d, xin, p.y.d, dyin,
                                                 p.bwd_filter.d, p.filter_algo, Workspace(),
                                                 p.filter_ws, beta, p.w.d, dwout));
  if (!direct) {
    Unstage(p, p.ws, nullptr, false, accumulate, dw, kernels::Elem::kF32, false, d.k, d.group_c(),
            d.r * d.s, stream_);
  }
  if (d.bias) {
    DPT_CHECK(db != nullptr) << "conv2d with bias needs a bias gradient";
    CheckF32(*db, "conv2d db");
    CheckNumel(*db, d.k, "conv2d db", d);
    // dy is f32 here (Supports: no bf16 dy with a bias): NCHW on cuDNN, channels-last as the
    // column sums of (N * P * Q, K), summed in double.
    if (d.y_nhwc) {
      kernels::ColumnSums(dy.data<float>(), d.n * pq, d.k, db->data<float>(), accumulate, stream_);
    } else {
      DPT_CUDNN_CHECK(cudnnConvolutionBackwardBias(cudnn_, &one, p.y32.d, dy.raw(),
                                                   accumulate ? &one : &zero, p.b32.d, db->raw()));
    }
  }
}

}  // namespace dptrain::cuda
