// SPDX-License-Identifier: Apache-2.0
// The CPU backend: the reference for every other backend. Convolution, linear and pooling run on
// oneDNN primitives prepared once per shape and cached; elementwise ops, batch norm, losses and
// optimizer updates are OpenMP loops over the shared math in core/elementwise.h.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/backend.h"

namespace dptrain::cpu {

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;

  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  // Every capability but the device timers, with or without cpu_fusions (the CUDA backend has
  // them too).
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.channels_last = true;
    c.deferred_batch_norm = c.bf16_sums = c.gradient_parts = true;
    return c;
  }
  // "" for fp32 where oneDNN has a Winograd kernel for this CPU (probed once: AVX-512).
  std::string WinogradProblem(Precision p) const override;
  bool WinogradPlanned() const override;
  // Whether conv2d `d` runs by Winograd when train.winograd is on: fp32, 3x3, stride 1, not
  // dilated or grouped, at least 32 input and output channels (below that oneDNN's Winograd
  // was slower here: ResNet-8's 16-channel stage at batch 128 took 1.5x the direct time).
  static bool WinogradApplies(const Conv2dDesc& d);
  // Whether a conv2d plan runs by Winograd (oneDNN may refuse it: then direct). For tests.
  static bool PlannedWinograd(const OpPlan& plan);
  size_t SharedWorkspaceBytes() const override;
  void ReleasePlans() override;

  void CopyFromHost(const void* src, Tensor* dst) override;
  void CopyToHost(const Tensor& src, void* dst) override;
  void Copy(const Tensor& src, Tensor* dst) override;
  void CopyColumns(const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col, int64_t cols);
  void Zero(Tensor* t);
  void Fill(Tensor* t, float value);
  // Every op of core/ops.h, each by the method of the same name below (cpu_backend.cc).
  void Run(const Op& op) override;
  // The planned entry (core/op_dispatch.h), by the methods of each family below.
  bool Supports(const PlanDesc& d) const override;
  std::shared_ptr<OpPlan> Prepare(const PlanDesc& d) override;
  void Run(const OpPlan& plan, const PlannedOp& op) override;
  void Synchronize() override {}

  bool Supports(const Conv2dDesc& d) const override;
  bool Supports(const LinearDesc& d) const override;
  bool Supports(const PoolDesc& d) const;
  bool Supports(const ConvPoolDesc& d) const override;  // fp32 and bf16 (cpu_conv_pool.cc)
  // Without cpu_fusions, the CUDA backend's: 16-bit tensors on channels-last activations only.
  bool Supports(const BatchNormArgs& a) const override {
    return (fusions_ || a.nhwc || (!a.dx_bf16 && !a.y_bf16 && !a.x_bf16)) && (!a.x_bf16 || a.nhwc);
  }
  // Whether conv2d computes its weight gradient as one GEMM over the input unfolded (im2col)
  // rather than oneDNN's convolution kernel: bf16, channels-last on both sides, not grouped, at
  // most 16 output pixels per image (ResNet-18's last stage at 32x32 input, 4x4). There oneDNN
  // 2.6's bf16 weight-gradient kernel runs at a third of the machine's bf16 rate and gains
  // nothing from a second thread; the GEMM runs at 80% (cpu_conv.cc). With the CPU fusions on,
  // the forward and the input gradient of those (at most 16 output pixels) are GEMMs over the
  // same columns too (ConvPlan::gemm). Also a strided convolution whose weight has at least 16,384
  // entries and whose columns take at most 16 MiB: oneDNN's strided bf16 weight-gradient kernels
  // ran at 290-530 GFLOP/s here (smaller weights leave the GEMM too few blocks for its threads).
  static bool UnfoldsWeightGradient(const Conv2dDesc& d);
  // Whether a conv2d plan runs its forward and input gradient as GEMMs over the unfolded input
  // too (ConvPlan::gemm: those convolutions, when the CPU fusions are on). For tests.
  static bool PlannedGemm(const OpPlan& plan);
  // Whether conv2d runs as the stride-1 convolution of x's every stride-th pixel of every
  // stride-th row, when the CPU fusions are on (ConvPlan::subsample): bf16, 1x1, stride above 1,
  // no padding, H and W multiples of the stride, channels-last on both sides (ResNet's
  // downsampling shortcuts). oneDNN 2.6's strided 1x1 bf16 kernels ran at 55-110 GFLOP/s here,
  // slower than its fp32 ones. In fp32 the staging costs what the dense kernel gains, so only
  // where the input gradient is handed over sampled (Conv2dDesc::dx_sub), which spares writing a
  // whole dx three quarters zeros.
  static bool SubsamplesInput(const Conv2dDesc& d);
  // Whether a conv2d plan runs so. For tests.
  static bool PlannedSubsample(const OpPlan& plan);
  // Whether conv2d's input gradient may run as the forward convolution of dy with the kernel
  // transposed (K <-> C) and rotated 180 degrees, padded by R - 1 - pad: stride 1, not dilated or
  // grouped, pad at most R - 1 and S - 1, channels-last on both sides, bf16, or fp32 with dx (the
  // flipped forward's output) wider than 4 (there that kernel splits its work badly, as in
  // PrepareConv2d).
  // PrepareConv2d then takes it where oneDNN's forward kernel for it is a brgemm one (brgconv),
  // which beat its backward-data kernels here (cpu_conv.cc).
  static bool FlipsBackwardData(const Conv2dDesc& d);
  // Whether a conv2d plan runs its input gradient so. For tests.
  static bool PlannedFlip(const OpPlan& plan);
  // Whether conv2d's weight gradient stages channels-last x and dy into oneDNN's blocked layout
  // (16 channels a block) and runs its kernel there, when the CPU fusions are on: fp32, 3x3,
  // stride 1, not dilated or grouped, channels-last on both sides, at least 32 input channels, at
  // least twice as many output channels, outputs at least 14 wide (a VGG-style layer that doubles
  // its channels: ref_cnn's conv2). There oneDNN 2.6's kernel on NHWC ran 1.11-1.31x the time of
  // staging plus its blocked kernel alone (32 -> 64 channels, 14 to 32 wide, batch 64)
  // and 1.2-1.35x inside ref_cnn's step (conv2 at batch 64: 1.67 -> 1.37 ms; at 256: 7.6 -> 5.6 ms,
  // AMD Zen 5); elsewhere (as many channels out as in, fewer than 32 in, narrower, strided, bf16)
  // NHWC was as fast or faster, and the staging costs memory (x and dy once more). Other kernel
  // sizes (a ResNet-50 bottleneck's 1x1 expansions) were not measured and stay on NHWC.
  static bool BlocksWeightGradient(const Conv2dDesc& d);
  // Whether a conv2d plan computes its weight gradient so. For tests.
  static bool PlannedBlockedWeightGradient(const OpPlan& plan);
  // Whether conv2d's input gradient may run as four stride-1 forward convolutions of dy, one per
  // phase of dx (its even or odd rows, by its even or odd columns), interleaved into dx
  // (ConvPlan::phases): bf16, 3x3, stride 2, pad 1, not dilated or grouped, H and W even,
  // channels-last on both sides, at least 32 input channels (the phases' outputs). A ResNet's
  // strided 3x3. oneDNN 2.6's strided bf16 backward-data kernel (jit:avx512_core_amx_bf16) took
  // 1.30 ms for resnet8's layer3.0.conv1 at batch 256 alone (2.68 ms inside a step), its
  // brgemm forward kernels 0.41 ms for the four phases; at 16 channels, 1.01 against 0.90.
  static bool PhasesBackwardData(const Conv2dDesc& d);
  // Whether a conv2d plan runs its input gradient so. For tests.
  static bool PlannedPhases(const OpPlan& plan);
  // Whether conv2d's weight gradient runs on AMX tiles (cpu_tiles.cc: TileWeightGradient) rather
  // than oneDNN's kernel or the unfolded GEMM, with the CPU fusions on: bf16, stride 1 or 2, not
  // dilated or grouped, dy channels-last and x too with C a multiple of 16 (or x planar with
  // under 16 channels: a first layer's), K a multiple of 16, C x K at most 256 x 256, 17 to
  // 16 x 16 output pixels (at most 16: the GEMM plans; up to 32 x 32 where C x K is at least
  // 64 x 64 or x is planar), kernels up to 7 x 7, not a subsampled 1x1 (SubsamplesInput), on a CPU
  // with AMX (TilesAvailable). oneDNN 2.6's bf16 weight-gradient kernel (jit:avx512_core_amx_bf16)
  // took 2-4x its forward's time on ResNet shapes here (resnet8's layer3.0.conv2 at batch 256:
  // 2.09 ms in a step, 0.96 on tiles; resnet18_cifar's layer3.1.conv1 at batch 64, 256 channels:
  // 5.6 -> 3.9 ms). Larger images are left to it: there the tiles' preparation of x and dy costs
  // what they save (resnet8's first stage, 16 channels at 32 x 32).
  // Without AMX, on a CPU with AVX512-BF16 (and VBMI2), the same sums run on dot products
  // (VDPBF16PS), two images at a time, for the ones with a channels-last x where that beats
  // oneDNN's avx512_core_bf16 kernel (cpu_tiles.cc): stride 2 with C x K up to 128 x 128, and
  // stride 1 with C x K up to 64 x 128 and up to 32 x 32 output pixels (ref_cnn's conv2, every 3x3
  // of ResNet-8 but its first, ResNet-18's first stage and its first strided 3x3).
  static bool TilesWeightGradient(const Conv2dDesc& d);
  // Whether the tiles' sums run on AVX512-BF16 dot products here (no AMX). For tests.
  static bool TilesByDotProducts();
  // Whether a conv2d plan runs its weight gradient so. For tests.
  static bool PlannedTiles(const OpPlan& plan);
  // channels_last (capabilities): oneDNN's convolutions read and write NHWC as fast as their
  // blocked layouts, without the reorders NCHW costs at both ends of each (cpu_conv.cc).

  std::shared_ptr<OpPlan> PrepareConv2d(const Conv2dDesc& d) override;
  void Conv2dForward(const OpPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                     Tensor* y) override;
  void Conv2dBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                          Tensor* dx) override;
  void Conv2dBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy, Tensor* dw,
                             Tensor* db, bool accumulate) override;
  void Conv2dBackward(const OpPlan& plan, const Tensor& x, const Tensor& dy, const Tensor& w,
                      Tensor* dx, Tensor* dw, Tensor* db, bool accumulate) override;

  std::shared_ptr<OpPlan> PrepareLinear(const LinearDesc& d) override;
  void LinearForward(const OpPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                     Tensor* y) override;
  void LinearBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                          Tensor* dx) override;
  void LinearBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy, Tensor* dw,
                             Tensor* db, bool accumulate) override;
  void LinearBackward(const OpPlan& plan, const Tensor& x, const Tensor& dy, const Tensor& w,
                      Tensor* dx, Tensor* dw, Tensor* db, bool accumulate) override;

  std::shared_ptr<OpPlan> PreparePool(const PoolDesc& d);
  void PoolForward(const OpPlan& plan, const Tensor& x, Tensor* y, Tensor* ws);
  void PoolBackward(const OpPlan& plan, const Tensor& dy, const Tensor* ws, Tensor* dx);

  void ConvPoolForward(const ConvPoolDesc& d, const Tensor& x, const Tensor& w, const Tensor* b,
                       Tensor* y, Tensor* ws);
  void ConvPoolBackward(const ConvPoolDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& ws, Tensor* dw, Tensor* db, bool accumulate);

  void ReluForward(const Tensor& x, Tensor* y);
  void ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx);
  void AffineAdd(const Tensor& x0, const Tensor* affine0, const Tensor& x1, const Tensor* affine1,
                 bool relu, Tensor* y);
  void ReluBackwardSum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, int64_t b_stride,
                       Tensor* dx);
  void ActivationForward(const ew::Activation& f, const Tensor& x, Tensor* y);
  void ActivationBackward(const ew::Activation& f, const Tensor& x, const Tensor& y,
                          const Tensor& dy, Tensor* dx);
  void Add(const Tensor& a, const Tensor& b, Tensor* y);
  void AddRelu(const Tensor& a, const Tensor& b, Tensor* y);
  void MulRows(const Tensor& x, const Tensor& s, Tensor* y);
  void RowDot(const Tensor& dy, const Tensor& x, Tensor* ds);
  void AddRows(const Tensor& x, const Tensor& s, Tensor* y);
  void RowSum(const Tensor& dy, Tensor* ds);
  void Pad2d(const Tensor& x, int64_t top, int64_t left, Tensor* y);
  void ToChannelsLast(const Tensor& x, Tensor* y);
  void FromChannelsLast(const Tensor& x, Tensor* y);
  void Scale(Tensor* t, float alpha);
  void DropoutForward(const Tensor& x, float p, uint64_t seed, Tensor* y);
  void DropoutBackward(const Tensor& dy, float p, uint64_t seed, Tensor* dx);

  void BatchNormForwardTraining(const BatchNormArgs& a, const Tensor& x, const Tensor& gamma,
                                const Tensor& beta, Tensor* running_mean, Tensor* running_var,
                                Tensor* y, Tensor* save_mean, Tensor* save_invstd);
  void BatchNormForwardInference(const BatchNormArgs& a, const Tensor& x, const Tensor& gamma,
                                 const Tensor& beta, const Tensor& running_mean,
                                 const Tensor& running_var, Tensor* y);
  void BatchNormBackward(const BatchNormArgs& a, const Tensor& x, const Tensor& dy,
                         const Tensor* relu_y, const Tensor& gamma, const Tensor& beta,
                         const Tensor& save_mean, const Tensor& save_invstd, Tensor* dx,
                         Tensor* dgamma, Tensor* dbeta, bool accumulate);
  void BatchNormAffineTraining(const BatchNormArgs& a, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, Tensor* running_mean, Tensor* running_var,
                               Tensor* affine, Tensor* save_mean, Tensor* save_invstd);
  void BatchNormAffineInference(const BatchNormArgs& a, const Tensor& gamma, const Tensor& beta,
                                const Tensor& running_mean, const Tensor& running_var,
                                Tensor* affine);
  void BatchNormBackwardSum(const BatchNormArgs& a, const Tensor& x, const Tensor& dy_a,
                            const Tensor& dy_b, const Tensor* relu_y, const Tensor& gamma,
                            const Tensor& beta, const Tensor& save_mean, const Tensor& save_invstd,
                            Tensor* dx, Tensor* dgamma, Tensor* dbeta, bool accumulate);

  void SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels, float label_smoothing,
                           Tensor* probs, Tensor* loss_sum, Tensor* correct);
  void SoftmaxCrossEntropyBackward(const Tensor& probs, const Tensor& labels, float label_smoothing,
                                   float scale, Tensor* dlogits);
  void MseLoss(const Tensor& y, const Tensor& t, Tensor* loss_sum);
  void MseBackward(const Tensor& y, const Tensor& t, float scale, Tensor* dy);

  void SgdStep(const ew::SgdHyper& h, Tensor* param, const Tensor& grad, Tensor* momentum);
  void AdamWStep(const ew::AdamWHyper& h, Tensor* param, const Tensor& grad, Tensor* m, Tensor* v);

  int64_t CountNonFinite(const Tensor& t) override;
  double SumSquares(const Tensor& t) override;

 private:
  struct Impl;  // oneDNN engine, stream and the plan caches
  // Whether PrepareConv2d plans d as a GEMM over the unfolded input (ConvPlan::gemm), and as the
  // stride-1 convolution of the subsampled input (ConvPlan::subsample), the one way it writes a
  // sampled input gradient (Conv2dDesc::dx_sub).
  bool PlansGemm(const Conv2dDesc& d) const;
  bool PlansSubsample(const Conv2dDesc& d) const;
  // Conv2dBackward and LinearBackward: both passes of a conv2d / linear plan, timed as the ops
  // `weights_op` and `data_op` (the profile's rows) with `flops` each.
  void WeightedBackward(const OpPlan& plan, double flops, const char* weights_op,
                        const char* data_op, const Tensor& x, const Tensor& dy, const Tensor& w,
                        Tensor* dx, Tensor* dw, Tensor* db, bool accumulate);
  // BatchNormBackward of dy, or of dy + *dy2 (BatchNormBackwardSum).
  void BatchNormGrad(const BatchNormArgs& a, const Tensor& x, const Tensor& dy, const Tensor* dy2,
                     const Tensor* relu_y, const Tensor& gamma, const Tensor& beta,
                     const Tensor& save_mean, const Tensor& save_invstd, Tensor* dx, Tensor* dgamma,
                     Tensor* dbeta, bool accumulate);
  // Threads (every call), Winograd, and cpu_fusions, which drops the cached plans when it
  // changes: whether a convolution plan flips its input gradient, runs as GEMMs, subsamples its
  // input and keeps per-layer staged inputs depends on it (ConvKey does not say).
  void ApplyOptions(const BackendOptions& next) override;
  std::unique_ptr<Impl> impl_;
  bool fusions_ = true;  // BackendOptions::cpu_fusions
};

// The oneDNN library this binary runs with, "2.6.3" (for `dptrain info`).
std::string OneDnnVersion();

}  // namespace dptrain::cpu
