// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's conv2d plan: RAII cuDNN descriptors and ConvPlan, shared by cuda_conv.cc
// (planning and running) and cuda_conv_algo.cc (the algorithm search); private to core/cuda/
// (scripts/check-floors.sh).
#pragma once

#include <cudnn.h>

#include <cstddef>

#include "core/backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels.h"

namespace dptrain::cuda {

// ---- cuDNN descriptors (RAII) -------------------------------------------------------------------

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { DPT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  void Set(cudnnDataType_t t, int64_t n, int64_t c, int64_t h, int64_t w,
           cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW) {
    DPT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, format, t, static_cast<int>(n),
                                               static_cast<int>(c), static_cast<int>(h),
                                               static_cast<int>(w)));
  }
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { DPT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { DPT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

struct ActivationDesc {
  cudnnActivationDescriptor_t d = nullptr;
  ActivationDesc() { DPT_CUDNN_CHECK(cudnnCreateActivationDescriptor(&d)); }
  ~ActivationDesc() { cudnnDestroyActivationDescriptor(d); }
  ActivationDesc(const ActivationDesc&) = delete;
  ActivationDesc& operator=(const ActivationDesc&) = delete;
};

struct ConvPlan final : OpPlan {
  Conv2dDesc d;
  bool half = false;
  // fp32 on tensor cores in TF32 allowed (BackendOptions::tf32): CUDNN_DEFAULT_MATH, and
  // PickConvAlgo's fp32 rules relaxed to those of 16 bits. Always false for 16-bit plans.
  bool tf32 = false;
  // The layout cuDNN computes in: NHWC activations and a KRSC filter, or NCHW and KCRS (see
  // ComputesChannelsLast).
  bool nhwc = false;
  kernels::Half kind = kernels::Half::kBF16;
  kernels::Elem ct = kernels::Elem::kF32;  // the compute element type
  TensorDesc x, y;                         // in the compute data type and layout
  TensorDesc y32;                          // f32 NCHW output, for the bias gradient
  TensorDesc b32;                          // (1, K, 1, 1) f32
  FilterDesc w;                            // in the compute data type and layout
  ConvDesc fwd, bwd_data, bwd_filter;      // one per op: each carries its algorithm's math type
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
  // A folded ReLU (d.relu) in fp32 with a bias, y written as it is: convolution, bias and ReLU in
  // one cuDNN call (cudnnConvolutionBiasActivationForward) until cuDNN reports it unsupported for
  // this plan's algorithm; otherwise and then, the epilogue after the convolution.
  ActivationDesc relu;
  mutable bool fused = false;
  // Staging in the compute type and layout, for the operands the caller's tensors do not hold so
  // (kernels::Convert), reused across the three ops (one stream: one op at a time): xs holds x or
  // dx, ys holds y or dy, ws holds w or dw. Undefined where nothing is staged.
  Tensor xs, ys, ws;
};

// Whether a plan computes channels-last: tensor-core kernels read NHWC as it is, where NCHW makes
// cuDNN transpose inside (extra kernels and memory traffic per call). Every convolution whose
// input and output are both channels-last already (the graph's layout pass), and in 16 bits also
// dense ones whose channel counts are multiples of 8 (whole 16-byte vectors), whatever the
// activations' layout, since their staging converts anyway. Others (a 3-channel stem reading the
// NCHW input) compute NCHW. PrepareConv2d falls back to NCHW where cuDNN refuses NHWC or offers no
// algorithm in it that meets the rules; the staging then transposes.
inline bool ComputesChannelsLast(const Conv2dDesc& d, bool half) {
  if (d.x_nhwc && d.y_nhwc) return true;
  return half && d.groups == 1 && d.c % 8 == 0 && d.k % 8 == 0;
}

// Chooses p's forward, backward-data and backward-filter algorithms by PickConvAlgo's rules
// (cuda_rules.h; strict fp32 unless p->tf32): deterministic backward algorithms, required when
// `deterministic` (train.deterministic), otherwise preferred unless `timed` in fp32; sets each
// descriptor's math type to the one cuDNN reported for its algorithm and records each workspace
// size. `cap` bounds the workspace where an algorithm allows. The candidates come in cuDNN's
// heuristic order (no timing, so every rank and every run picks the same ones), or with `timed`
// (train.cudnn_benchmark) in the order of cuDNN's timings on this GPU (cudnnFind*, which allocates
// its own scratch outside the caching allocator for the duration of the search). Throws
// UnsupportedError naming the layer when cuDNN offers no usable algorithm.
void ChooseConvAlgorithms(cudnnHandle_t cudnn, ConvPlan* p, bool deterministic, bool timed,
                          size_t cap);

}  // namespace dptrain::cuda
