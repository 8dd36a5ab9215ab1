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
  // 16-bit operands staged channels-last (NHWC activations, KRSC filter): see ChannelsLast.
  bool nhwc = false;
  kernels::Half kind = kernels::Half::kBF16;
  TensorDesc x, y;                     // in the compute data type (and layout)
  TensorDesc y32;                      // the f32 output, for the bias add and the bias gradient
  TensorDesc b32;                      // (1, K, 1, 1) f32
  FilterDesc w;                        // in the compute data type
  ConvDesc fwd, bwd_data, bwd_filter;  // one per op: each carries its algorithm's math type
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
  // A folded ReLU (d.relu) in fp32 with a bias: convolution, bias and ReLU in one cuDNN call
  // (cudnnConvolutionBiasActivationForward) until cuDNN reports it unsupported for this plan's
  // algorithm; otherwise and then, one epilogue kernel after the convolution.
  ActivationDesc relu;
  mutable bool fused = false;
  // bf16/fp16 staging, reused across the three ops (one stream: one op at a time):
  // x16 holds x or dx, y16 holds y or dy, w16 holds w or dw.
  Tensor x16, y16, w16;
};

// Whether a 16-bit convolution stages its operands channels-last: tensor-core kernels read NHWC
// as it is, where NCHW makes cuDNN transpose inside (extra kernels and memory traffic per call),
// and the staging kernels that convert to 16 bits transpose at the same time. Dense convolutions
// whose channel counts are multiples of 8 (whole 16-byte vectors of 16-bit values); others (the
// 3-channel stem, grouped and depthwise ones) stay NCHW, as does one for which cuDNN offers no
// algorithm in NHWC that meets the rules (PrepareConv2d tries NHWC first).
inline bool ChannelsLast(const Conv2dDesc& d, bool half) {
  return half && d.groups == 1 && d.c % 8 == 0 && d.k % 8 == 0;
}

// Chooses p's forward, backward-data and backward-filter algorithms and PickConvAlgo's rules
// (cuda_rules.h): deterministic backward algorithms, required when `deterministic`
// (train.deterministic), otherwise preferred unless `timed` in fp32; sets each descriptor's math
// type to the one cuDNN reported for its algorithm and records each workspace size. `cap` bounds
// the workspace where an algorithm allows. The candidates come in cuDNN's heuristic order (no
// timing, so every rank and every run picks the same ones), or with `timed` (train.cudnn_benchmark)
// in the order of cuDNN's timings on this GPU (cudnnFind*, which allocates its own scratch outside
// the caching allocator for the duration of the search). Throws UnsupportedError naming the layer
// when cuDNN offers no usable algorithm.
void ChooseConvAlgorithms(cudnnHandle_t cudnn, ConvPlan* p, bool deterministic, bool timed,
                          size_t cap);

}  // namespace dptrain::cuda
