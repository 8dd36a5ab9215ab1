// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's decisions that need no GPU, as pure functions over plain values: which
// conv2d shapes cuDNN's legacy descriptors can describe, which of cuDNN's heuristic algorithms to
// run, and how a device (a whole GPU or a MIG instance) is named. No CUDA types: unit tests
// (tests/cuda/cuda_rules_test.cc, label unit) check them on machines without a GPU.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"

namespace dptrain::cuda {

// Whether every operand of `d` (x, w, y; and so every stride of their packed NCHW layouts) can be
// described by cuDNN's 4-d descriptors and cuBLAS, whose dimensions, strides and element counts
// are ints. Larger tensors are unsupported (an error at setup naming the layer), never a failure
// in PrepareConv2d. The shape itself must be valid (positive sizes and output).
bool ConvFitsLegacyDescriptors(const Conv2dDesc& d);

// One result of cuDNN's heuristic algorithm query (cudnnConvolution*AlgoPerf_t), as PickConvAlgo
// needs it. `math` holds the cudnnMathType_t value cuDNN reported for the algorithm.
struct AlgoCandidate {
  bool ok = false;  // status == CUDNN_STATUS_SUCCESS
  bool deterministic = false;
  int math = 0;
  size_t workspace = 0;
  // False for the FFT and non-fused Winograd algorithms: their transforms round more than a
  // direct or implicit-GEMM sum (measured on an H100: fp32 weight gradients of resnet18's 3x3
  // layers off by up to 3% on the elements where the sum cancels, ~15x the CPU backend's
  // rounding).
  bool precise = true;
};
// The cudnnMathType_t values (cudnn_graph.h), mirrored so that no CUDA header is needed here.
inline constexpr int kCudnnDefaultMath = 0, kCudnnTensorOpMath = 1,
                     kCudnnTensorOpMathAllowConversion = 2, kCudnnFmaMath = 3;

enum class Determinism {
  kAny,        // forward: every cuDNN forward algorithm is deterministic anyway
  kPreferred,  // backward, train.deterministic = false: deterministic if any qualifies
  kRequired,   // backward, train.deterministic = true: never relaxed (nullopt instead)
};

// Index into `perfs` (cuDNN's order: fastest first) of the algorithm to run, nullopt when none is
// usable. Requirements, relaxed in this order when nothing qualifies:
//   1. workspace within `cap` (dropped first: a larger workspace only costs memory),
//   2. a precise algorithm (not FFT or non-fused Winograd), in every precision: in 16 bits their
//      transforms round in 16 bits too (on an H100 they put resnet50_cifar's bf16 loss 3.2% from
//      fp32, against 0.7% on the CPU backend),
//   3. fp32 with `fp32_strict` (train.tf32 = false): FMA math, no tensor-op (TF32) algorithm;
//      relaxed to CUDNN_DEFAULT math, never to a tensor-op one. With train.tf32 an fp32
//      convolution is not strict: cuDNN's order decides, tensor-op (TF32) algorithms included. The
//      caller sets the descriptor to the math type cuDNN reported for the chosen algorithm, so it
//      is never forced onto one it does not support,
//   4. determinism, only when Determinism::kPreferred.
// `relaxed` (optional) receives what had to be given up, "" when nothing.
std::optional<size_t> PickConvAlgo(const std::vector<AlgoCandidate>& perfs, bool fp32_strict,
                                   Determinism determinism, size_t cap,
                                   std::string* relaxed = nullptr);

// Blocks the CUDA batch norm splits each channel's n*hw elements over (runs of whole samples):
// enough that a layer with few channels fills the GPU (one block per channel gave resnet18's
// 64-channel layers 64 blocks on an H100's 132 SMs: 0.8 ms per forward at batch 256, about 8x
// the memory bound), at least 4096 elements a block, at most n. A function of the shape alone,
// so the fixed-order reduction gives the same result on every GPU; c * parts <= c + 512.
int64_t BatchNormParts(int64_t n, int64_t c, int64_t hw);

// Parts the rows of a channels-last batch norm over m = N * H * W rows of c channels are split into
// (blocks of 32 channels x a run of rows): enough that the blocks fill the GPU (about 1024 of
// them), at least 64 rows a part, at most 65535 (the grid's y). A function of the shape alone, as
// BatchNormParts.
int64_t BatchNormNhwcParts(int64_t m, int64_t c);
// The doubles of scratch the channels-last batch norm needs: the parts' two sums per channel, then
// per-channel terms (at most 4 floats a channel).
int64_t BatchNormNhwcScratch(int64_t m, int64_t c);

using Uuid = std::array<unsigned char, 16>;
// The device's name as nvidia-smi -L and CUDA_VISIBLE_DEVICES write it. `device` is what
// cuDeviceGetUuid_v2 returns (a MIG instance's own UUID); `gpu` what the original
// cuDeviceGetUuid returns (the physical GPU's, also for its MIG instances), when known. They
// differ only on a MIG instance: "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; otherwise
// "GPU-...". Two MIG slices of one GPU therefore get different names, and the launcher's
// one-rank-per-GPU check tells them apart.
std::string DeviceUuidString(const Uuid& device, const std::optional<Uuid>& gpu);

}  // namespace dptrain::cuda
