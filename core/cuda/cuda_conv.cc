// SPDX-License-Identifier: Apache-2.0
// CUDA backend: conv2d on cuDNN's descriptor ("legacy") API, planned once per shape and
// precision (descriptors, algorithms, workspace, 16-bit staging) and cached; the bias gradient on
// cuDNN too, the bias add on cuDNN or in the epilogue kernel that widens 16-bit results and
// applies a folded ReLU. The algorithm search is in cuda_conv_algo.cc.
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

// A plan's f32 operand t, seen as (planes, c, hw), into its 16-bit staging buffer: as it is, or
// channels-last (p.nhwc).
void StageHalf(const ConvPlan& p, const Tensor& t, int64_t planes, int64_t c, int64_t hw, void* out,
               cudaStream_t s) {
  if (p.nhwc) {
    kernels::F32ToHalfChannelsLast(p.kind, t.data<float>(), out, planes, c, hw, s);
  } else {
    kernels::F32ToHalf(p.kind, t.data<float>(), out, t.numel(), s);
  }
}

// A 16-bit result back into the f32 tensor t (planes, c, hw), with the bias b (nullable) and a
// folded ReLU, or added into t (accumulate; then neither b nor relu).
void UnstageHalf(const ConvPlan& p, const void* in, const float* b, bool relu, bool accumulate,
                 Tensor* t, int64_t planes, int64_t c, int64_t hw, cudaStream_t s) {
  if (p.nhwc) {
    kernels::HalfChannelsLastToF32(p.kind, in, b, relu, accumulate, t->data<float>(), planes, c, hw,
                                   s);
  } else if (b != nullptr || relu) {
    kernels::ConvEpilogue(p.kind, in, b, relu, t->data<float>(), planes, c, hw, s);
  } else {
    kernels::HalfToF32(p.kind, in, t->data<float>(), t->numel(), accumulate, s);
  }
}

}  // namespace

std::shared_ptr<OpPlan> CudaBackend::PrepareConv2d(const Conv2dDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cuda: conv2d " << d.ToString();
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot =
      conv_plans_[std::make_tuple(d.n, d.c, d.h, d.w, d.k, d.r, d.s, d.stride, d.pad, d.bias,
                                  static_cast<int>(d.precision), d.groups, d.dilation, d.relu)];
  if (slot) return slot;
  MakeCurrent();
  auto p = std::make_shared<ConvPlan>();
  p->d = d;
  p->half = IsHalf(d.precision);
  p->kind = HalfKind(d.precision);
  const cudnnDataType_t dt = !p->half                          ? CUDNN_DATA_FLOAT
                             : d.precision == Precision::kBF16 ? CUDNN_DATA_BFLOAT16
                                                               : CUDNN_DATA_HALF;
  const int64_t P = d.out_h(), Q = d.out_w();
  p->y32.Set(CUDNN_DATA_FLOAT, d.n, d.k, P, Q);
  p->b32.Set(CUDNN_DATA_FLOAT, 1, d.k, 1, 1);
  // Cross-correlation (no kernel flip), as PyTorch's Conv2d; f32 accumulation in every precision.
  // fp32: FMA-only kernels (CUDNN_DEFAULT_MATH would allow TF32 on Ampere and newer).
  const cudnnMathType_t math = p->half ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  for (ConvDesc* c : {&p->fwd, &p->bwd_data, &p->bwd_filter}) {
    DPT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        c->d, static_cast<int>(d.pad), static_cast<int>(d.pad), static_cast<int>(d.stride),
        static_cast<int>(d.stride), static_cast<int>(d.dilation), static_cast<int>(d.dilation),
        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DPT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(c->d, static_cast<int>(d.groups)));
  }
  // The operands' descriptors in one layout, and the algorithms for it: cuDNN's heuristics (or
  // its timings), deterministic backward ones (cuda_conv_algo.cc). The descriptors keep the
  // logical (N, C, H, W) / (K, C, R, S) sizes; the format says how the staged 16-bit buffers lay
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
  if (ChannelsLast(d, p->half)) {
    try {
      plan_layout(true);
    } catch (const UnsupportedError&) {
      // No algorithm meets the rules in NHWC (train.deterministic = true on a GPU whose
      // deterministic 16-bit kernels are NCHW only): the layout cuDNN has them for.
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
  p->fused = d.relu && d.bias && !p->half;
  if (p->half) {
    const DType ht = HalfDType(d.precision);
    p->x16 = Empty(Shape{d.n * d.c * d.h * d.w}, ht, "conv2d 16-bit x/dx");
    p->y16 = Empty(Shape{d.n * d.k * P * Q}, ht, "conv2d 16-bit y/dy");
    p->w16 = Empty(Shape{d.weight_numel()}, ht, "conv2d 16-bit w/dw");
  }
  slot = p;
  return p;
}

void CudaBackend::Conv2dForward(const OpPlan& plan, const Tensor& x, const Tensor& w,
                                const Tensor* b, Tensor* y) {
  OpScope scope(this, "conv2d_fwd");
  const auto& p = static_cast<const ConvPlan&>(plan);
  const Conv2dDesc& d = p.d;
  scope.set_flops(d.flops());
  CheckF32(x, "conv2d x");
  CheckF32(w, "conv2d w");
  CheckF32(*y, "conv2d y");
  CheckNumel(x, d.n * d.c * d.h * d.w, "conv2d x", d.ToString());
  CheckNumel(w, d.weight_numel(), "conv2d w", d.ToString());
  CheckNumel(*y, d.n * d.k * d.out_h() * d.out_w(), "conv2d y", d.ToString());
  DPT_CHECK(!d.bias || b != nullptr) << "conv2d with bias needs a bias tensor";
  if (d.bias) {
    CheckF32(*b, "conv2d b");
    CheckNumel(*b, d.k, "conv2d b", d.ToString());
  }
  const float one = 1.f, zero = 0.f;
  const void* xin = x.raw();
  const void* win = w.raw();
  void* yout = y->raw();
  const int64_t hw = d.h * d.w, pq = d.out_h() * d.out_w(), rs = d.r * d.s;
  if (p.half) {
    StageHalf(p, x, d.n, d.c, hw, p.x16.raw(), stream_);
    StageHalf(p, w, d.k, d.group_c(), rs, p.w16.raw(), stream_);
    xin = p.x16.raw();
    win = p.w16.raw();
    yout = p.y16.raw();
  }
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
  // Widening (and the layout back from channels-last), bias and ReLU in one pass over the output.
  if (p.half) {
    UnstageHalf(p, p.y16.raw(), d.bias ? b->data<float>() : nullptr, d.relu, false, y, d.n, d.k, pq,
                stream_);
  } else if (d.relu) {
    kernels::ConvEpilogue(p.kind, nullptr, d.bias ? b->data<float>() : nullptr, true,
                          y->data<float>(), d.n, d.k, pq, stream_);
  } else if (d.bias) {
    DPT_CUDNN_CHECK(cudnnAddTensor(cudnn_, &one, p.b32.d, b->raw(), &one, p.y32.d, y->raw()));
  }
}

void CudaBackend::Conv2dBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                     Tensor* dx) {
  OpScope scope(this, "conv2d_bwd_data");
  const auto& p = static_cast<const ConvPlan&>(plan);
  const Conv2dDesc& d = p.d;
  scope.set_flops(d.flops());
  CheckF32(dy, "conv2d dy");
  CheckF32(w, "conv2d w");
  CheckF32(*dx, "conv2d dx");
  CheckNumel(dy, d.n * d.k * d.out_h() * d.out_w(), "conv2d dy", d.ToString());
  CheckNumel(*dx, d.n * d.c * d.h * d.w, "conv2d dx", d.ToString());
  const float one = 1.f, zero = 0.f;
  const void* dyin = dy.raw();
  const void* win = w.raw();
  void* dxout = dx->raw();
  if (p.half) {
    StageHalf(p, dy, d.n, d.k, d.out_h() * d.out_w(), p.y16.raw(), stream_);
    StageHalf(p, w, d.k, d.group_c(), d.r * d.s, p.w16.raw(), stream_);
    dyin = p.y16.raw();
    win = p.w16.raw();
    dxout = p.x16.raw();
  }
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, p.w.d, win, p.y.d, dyin, p.bwd_data.d,
                                               p.data_algo, Workspace(), p.data_ws, &zero, p.x.d,
                                               dxout));
  if (p.half) UnstageHalf(p, p.x16.raw(), nullptr, false, false, dx, d.n, d.c, d.h * d.w, stream_);
}

void CudaBackend::Conv2dBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                        Tensor* dw, Tensor* db, bool accumulate) {
  OpScope scope(this, "conv2d_bwd_weights");
  const auto& p = static_cast<const ConvPlan&>(plan);
  const Conv2dDesc& d = p.d;
  scope.set_flops(d.flops());
  CheckF32(x, "conv2d x");
  CheckF32(dy, "conv2d dy");
  CheckF32(*dw, "conv2d dw");
  CheckNumel(x, d.n * d.c * d.h * d.w, "conv2d x", d.ToString());
  CheckNumel(dy, d.n * d.k * d.out_h() * d.out_w(), "conv2d dy", d.ToString());
  CheckNumel(*dw, d.weight_numel(), "conv2d dw", d.ToString());
  const float one = 1.f, zero = 0.f;
  const void* xin = x.raw();
  const void* dyin = dy.raw();
  void* dwout = dw->raw();
  // beta = 1 adds into the existing gradient (accumulation); 16-bit results are added when
  // widened instead, so cuDNN never reads the 16-bit staging buffer.
  const float* beta = accumulate && !p.half ? &one : &zero;
  if (p.half) {
    StageHalf(p, x, d.n, d.c, d.h * d.w, p.x16.raw(), stream_);
    StageHalf(p, dy, d.n, d.k, d.out_h() * d.out_w(), p.y16.raw(), stream_);
    xin = p.x16.raw();
    dyin = p.y16.raw();
    dwout = p.w16.raw();
  }
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, p.x.d, xin, p.y.d, dyin,
                                                 p.bwd_filter.d, p.filter_algo, Workspace(),
                                                 p.filter_ws, beta, p.w.d, dwout));
  if (p.half) {
    UnstageHalf(p, p.w16.raw(), nullptr, false, accumulate, dw, d.k, d.group_c(), d.r * d.s,
                stream_);
  }
  if (d.bias) {
    DPT_CHECK(db != nullptr) << "conv2d with bias needs a bias gradient";
    CheckF32(*db, "conv2d db");
    CheckNumel(*db, d.k, "conv2d db", d.ToString());
    DPT_CUDNN_CHECK(cudnnConvolutionBackwardBias(cudnn_, &one, p.y32.d, dy.raw(),
                                                 accumulate ? &one : &zero, p.b32.d, db->raw()));
  }
}

}  // namespace dptrain::cuda
