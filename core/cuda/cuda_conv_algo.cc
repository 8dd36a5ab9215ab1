// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's cuDNN algorithm search for conv2d: PickAlgo's order of preference over
// cuDNN's heuristic results, and the three queries (forward, backward data, backward filter).
#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_conv_impl.h"
#include "core/error.h"

namespace dptrain::cuda {
namespace {

// Picks the first (fastest by cuDNN's heuristics) usable result: status OK, deterministic when
// asked, workspace within `cap`, and for fp32 FMA-only math (no TF32). Constraints are relaxed in
// order (workspace cap, then determinism, then for fp32 any result whose math is not tensor-op:
// the descriptor is set to CUDNN_FMA_MATH anyway) when nothing qualifies.
template <class Perf>
const Perf* PickAlgo(const std::vector<Perf>& perfs, bool fp32, bool want_deterministic,
                     size_t cap) {
  for (int pass = 0; pass < 4; ++pass) {
    const bool capped = pass == 0;
    const bool det = want_deterministic && pass < 2;
    const bool strict_math = pass < 3;
    for (const Perf& p : perfs) {
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (fp32 && strict_math && p.mathType != CUDNN_FMA_MATH) continue;
      if (fp32 && (p.mathType == CUDNN_TENSOR_OP_MATH ||
                   p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) {
        continue;
      }
      if (det && p.determinism != CUDNN_DETERMINISTIC) continue;
      if (capped && p.memory > cap) continue;
      return &p;
    }
  }
  return nullptr;
}

}  // namespace

void ChooseConvAlgorithms(cudnnHandle_t cudnn, ConvPlan* p, cudnnMathType_t math, size_t cap) {
  const Conv2dDesc& d = p->d;
  const bool fp32 = !p->half;
  auto fail = [&](const char* what) {
    DPT_THROW(UnsupportedError) << "cuda: cuDNN offers no usable " << what << " algorithm for "
                                << d.ToString();
  };
  {
    int max = 0, got = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(cudnn, &max));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perfs(static_cast<size_t>(std::max(max, 1)));
    DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cudnn, p->x.d, p->w.d, p->fwd.d, p->y.d,
                                                           static_cast<int>(perfs.size()), &got,
                                                           perfs.data()));
    perfs.resize(static_cast<size_t>(got));
    const auto* best = PickAlgo(perfs, fp32, false, cap);
    if (best == nullptr) fail("forward");
    p->fwd_algo = best->algo;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->fwd.d, fp32 ? math : best->mathType));
    DPT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cudnn, p->x.d, p->w.d, p->fwd.d, p->y.d,
                                                            p->fwd_algo, &p->fwd_ws));
  }
  {
    int max = 0, got = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnn, &max));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(static_cast<size_t>(std::max(max, 1)));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        cudnn, p->w.d, p->y.d, p->bwd_data.d, p->x.d, static_cast<int>(perfs.size()), &got,
        perfs.data()));
    perfs.resize(static_cast<size_t>(got));
    const auto* best = PickAlgo(perfs, fp32, true, cap);
    if (best == nullptr) fail("backward-data");
    p->data_algo = best->algo;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->bwd_data.d, fp32 ? math : best->mathType));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
        cudnn, p->w.d, p->y.d, p->bwd_data.d, p->x.d, p->data_algo, &p->data_ws));
  }
  {
    int max = 0, got = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnn, &max));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perfs(static_cast<size_t>(std::max(max, 1)));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        cudnn, p->x.d, p->y.d, p->bwd_filter.d, p->w.d, static_cast<int>(perfs.size()), &got,
        perfs.data()));
    perfs.resize(static_cast<size_t>(got));
    const auto* best = PickAlgo(perfs, fp32, true, cap);
    if (best == nullptr) fail("backward-filter");
    p->filter_algo = best->algo;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->bwd_filter.d, fp32 ? math : best->mathType));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        cudnn, p->x.d, p->y.d, p->bwd_filter.d, p->w.d, p->filter_algo, &p->filter_ws));
  }
}

}  // namespace dptrain::cuda
