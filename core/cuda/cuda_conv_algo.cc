// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's cuDNN algorithm search for conv2d: the three heuristic (or, with
// train.cudnn_benchmark, timed) queries (forward, backward data, backward filter), each answered
// by PickConvAlgo (cuda_rules.h); every descriptor keeps the math type cuDNN reported for its
// algorithm.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_conv_impl.h"
#include "core/cuda/cuda_rules.h"
#include "core/error.h"
#include "core/memory/caching_allocator.h"

namespace dptrain::cuda {
namespace {

// The FFT and non-fused Winograd algorithms (AlgoCandidate::precise).
bool Precise(cudnnConvolutionFwdAlgo_t a) {
  return a != CUDNN_CONVOLUTION_FWD_ALGO_FFT && a != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool Precise(cudnnConvolutionBwdDataAlgo_t a) {
  return a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT &&
         a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool Precise(cudnnConvolutionBwdFilterAlgo_t a) {
  return a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT &&
         a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// cuDNN's results as PickConvAlgo (cuda_rules.cc) sees them.
template <class Perf>
std::vector<AlgoCandidate> Candidates(const std::vector<Perf>& perfs) {
  std::vector<AlgoCandidate> out;
  out.reserve(perfs.size());
  for (const Perf& p : perfs) {
    out.push_back({p.status == CUDNN_STATUS_SUCCESS, p.determinism == CUDNN_DETERMINISTIC,
                   static_cast<int>(p.mathType), p.memory, Precise(p.algo)});
  }
  return out;
}

// One algorithm query's results: cuDNN's timed search (train.cudnn_benchmark) or its heuristic.
// The timed search allocates its own buffers and workspace with cudaMalloc; planned mid-run (the
// evaluator's smaller last batch, a new micro-batch) the caching allocator may hold most of the
// device, and the search can fail for want of memory: the call itself, or each algorithm it
// tried (a result's status is ALLOC_FAILED when its workspace could not be had, while the call
// succeeds). When it fails, or none of its results can be used (`usable`: PickConvAlgo finds
// one), the heuristic answers, with a warning, and the failed allocation's error is cleared so
// no later check reports it.
template <class Perf, class Find, class Get, class Usable, class... Args>
std::vector<Perf> QueryAlgorithms(bool timed, int max, Find find, Get get, Usable usable,
                                  const char* what, const Conv2dDesc& d, Args... args) {
  std::vector<Perf> perfs(static_cast<size_t>(std::max(max, 1)));
  int got = 0;
  if (timed) {
    const cudnnStatus_t s = find(args..., static_cast<int>(perfs.size()), &got, perfs.data());
    std::string why;
    if (s == CUDNN_STATUS_SUCCESS) {
      perfs.resize(static_cast<size_t>(got));
      if (usable(perfs)) return perfs;
      why = "none of the algorithms it ran can be used here; short of memory for a workspace?";
      perfs.assign(static_cast<size_t>(std::max(max, 1)), Perf{});
      got = 0;
    } else {
      why = detail::CudnnStatusText(static_cast<int>(s));
    }
    (void)cudaGetLastError();
    std::fprintf(stderr,
                 "%sdptrain: warning: cuDNN's timed %s search failed for %s (%s); using its "
                 "heuristic choice\n",
                 RankTag().c_str(), what, d.ToString().c_str(), why.c_str());
  }
  DPT_CUDNN_CHECK(get(args..., static_cast<int>(perfs.size()), &got, perfs.data()));
  perfs.resize(static_cast<size_t>(got));
  return perfs;
}

}  // namespace

void ChooseConvAlgorithms(cudnnHandle_t cudnn, ConvPlan* p, bool deterministic, bool timed,
                          size_t cap) {
  const Conv2dDesc& d = p->d;
  const bool fp32 = !p->half;
  // PickConvAlgo's fp32 rules (no tensor-op math, FMA preferred) unless TF32 is allowed.
  const bool strict = fp32 && !p->tf32;
  // Timed fp32 without train.deterministic, as PyTorch's cudnn.benchmark: the fastest backward
  // algorithm, deterministic or not (a timed choice already gives up bit-identical reruns). On an
  // H100, resnet18 at 32x32 batch 256: fp32 5,123 -> 6,173 samples/s (timed and deterministic
  // preferred: 5,208); bf16 the other way, 16,116 -> 11,738 (its non-deterministic weight
  // gradients time fast alone and run slow in the step), so 16 bits keep preferring
  // deterministic ones (15,634).
  const Determinism backward = deterministic     ? Determinism::kRequired
                               : (timed && fp32) ? Determinism::kAny
                                                 : Determinism::kPreferred;
  // Returns the chosen result; throws naming the layer (the setup's allocation scope) when
  // cuDNN offers none that meets the requirements.
  auto pick =
      [&](const auto& perfs, Determinism det, const char* what) {
        std::string relaxed;
        const auto i = PickConvAlgo(Candidates(perfs), strict, det, cap, &relaxed);
        if (i && strict && perfs[*i].mathType != CUDNN_FMA_MATH) {
          const std::string& scope = AllocationScope::Current();
          const std::string layer = scope.empty() ? "" : " (layer " + scope + ")";
          std::fprintf(stderr,
                       "%sdptrain: warning: cuDNN has no FMA-only %s algorithm for %s%s; using one "
                       "with CUDNN_DEFAULT_MATH, which may use TF32 on Ampere and later GPUs\n",
                       RankTag().c_str(), what, d.ToString().c_str(), layer.c_str());
        }
        if (!i) {
          const std::string& layer = AllocationScope::Current();
          DPT_THROW(UnsupportedError)
              << "cuda: cuDNN offers no usable " << what << " algorithm"
              << (det == Determinism::kRequired ? " that is deterministic" : "") << " for "
              << d.ToString() << (layer.empty() ? "" : " (layer " + layer + ")")
              << (det == Determinism::kRequired
                      ? "; train.deterministic = true never falls back to a non-deterministic one "
                        "(set it to false to allow that)"
                      : "");
        }
        return perfs[*i];
      };
  // Whether PickConvAlgo finds an algorithm among a query's results.
  const auto usable = [&](Determinism det) {
    return [&, det](const auto& perfs) {
      std::string relaxed;
      return PickConvAlgo(Candidates(perfs), strict, det, cap, &relaxed).has_value();
    };
  };
  {
    int max = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(cudnn, &max));
    // The timed and the heuristic queries take the same arguments and return the same records.
    const auto perfs = QueryAlgorithms<cudnnConvolutionFwdAlgoPerf_t>(
        timed, max, cudnnFindConvolutionForwardAlgorithm, cudnnGetConvolutionForwardAlgorithm_v7,
        usable(Determinism::kAny), "forward", d, cudnn, p->x.d, p->w.d, p->fwd.d, p->y.d);
    const auto best = pick(perfs, Determinism::kAny, "forward");
    p->fwd_algo = best.algo;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->fwd.d, best.mathType));
    DPT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cudnn, p->x.d, p->w.d, p->fwd.d, p->y.d,
                                                            p->fwd_algo, &p->fwd_ws));
  }
  {
    int max = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnn, &max));
    const auto perfs = QueryAlgorithms<cudnnConvolutionBwdDataAlgoPerf_t>(
        timed, max, cudnnFindConvolutionBackwardDataAlgorithm,
        cudnnGetConvolutionBackwardDataAlgorithm_v7, usable(backward), "backward-data", d, cudnn,
        p->w.d, p->y.d, p->bwd_data.d, p->x.d);
    const auto best = pick(perfs, backward, "backward-data");
    p->data_algo = best.algo;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->bwd_data.d, best.mathType));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
        cudnn, p->w.d, p->y.d, p->bwd_data.d, p->x.d, p->data_algo, &p->data_ws));
  }
  {
    int max = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnn, &max));
    const auto perfs = QueryAlgorithms<cudnnConvolutionBwdFilterAlgoPerf_t>(
        timed, max, cudnnFindConvolutionBackwardFilterAlgorithm,
        cudnnGetConvolutionBackwardFilterAlgorithm_v7, usable(backward), "backward-filter", d,
        cudnn, p->x.d, p->y.d, p->bwd_filter.d, p->w.d);
    const auto best = pick(perfs, backward, "backward-filter");
    p->filter_algo = best.algo;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->bwd_filter.d, best.mathType));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        cudnn, p->x.d, p->y.d, p->bwd_filter.d, p->w.d, p->filter_algo, &p->filter_ws));
  }
}

}  // namespace dptrain::cuda
