// SPDX-License-Identifier: Apache-2.0
// The CUDA backend class and the helpers its .cc files share (argument checks, precision
// helpers, device scalar slots). Private to core/cuda/ (scripts/check-floors.sh enforces it): code
// elsewhere that needs the backend's stream or device (the NCCL communicator) uses
// core/cuda/cuda_interop.h. Includes CUDA, cuDNN and cuBLAS headers.
//
// Stream model: every op runs on one non-blocking compute stream per backend, so ops are ordered
// among themselves and asynchronous to the host; calls that return values to the host
// (CopyToHost, CountNonFinite, SumSquares, Synchronize) synchronise it, and then report errors
// found on the device meanwhile (a label outside [0, K) in SoftmaxCrossEntropy: SyncStream).
// CopyFromHostAsync stages the batch in pinned memory and copies it on a copy stream, ordered
// after the compute work queued before it and before the work queued after it, so a training
// step never waits for the host.
// The caching allocator is not stream-aware: a buffer released on the host goes back to the cache
// while kernels that use it may still be queued, which is safe only because every later user of
// that buffer is queued behind them on the same stream. Work on other streams (NCCL's
// communication stream) must therefore keep its tensors alive until it has finished (the NCCL
// handles hold a reference until their collective completed).
//
// Threads: the backend's device is made current by the thread that creates it; copies,
// synchronisation, the checks and Prepare* make it current again (MakeCurrent), so they may be
// called from other threads too (under the remap binding the device is 0 everywhere anyway).
// CopyFromHost blocks until the data is on the device (for parameters, checkpoints and tests);
// CopyFromHostAsync returns once the source is staged.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <driver_types.h>

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/backend.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernels.h"
#include "core/error.h"

namespace dptrain::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int ordinal);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return "cuda"; }

  // ---- for the NCCL communicator and the registry ----
  cudaStream_t stream() const { return stream_; }
  int ordinal() const { return ordinal_; }
  const DeviceIdentity& identity() const { return identity_; }

  void CopyFromHost(const void* src, Tensor* dst) override;
  void CopyFromHostAsync(const void* src, Tensor* dst) override;
  void CopyToHost(const Tensor& src, void* dst) override;
  void Copy(const Tensor& src, Tensor* dst) override;
  void CopyColumns(const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col, int64_t cols);
  void Zero(Tensor* t);
  void Fill(Tensor* t, float value);
  // Every op of core/ops.h, each by the method of the same name below (cuda_backend.cc); the CPU
  // backend's fusions (ConvPoolForward, AffineAdd, ...) are an InternalError here.
  void Run(const Op& op) override;
  // The planned entry (core/op_dispatch.h), by the methods of each family below.
  bool Supports(const PlanDesc& d) const override;
  std::shared_ptr<OpPlan> Prepare(const PlanDesc& d) override;
  void Run(const OpPlan& plan, const PlannedOp& op) override;
  void Synchronize() override;
  // The profile times ops with events on the compute stream (no synchronisation per op).
  // Channels-last activations between convolutions, batch norms, pooling and the elementwise ops:
  // cuDNN's tensor-core convolutions read and write NHWC without transposes, and the batch norm
  // and pooling kernels take either layout. A ResNet block's batch norms applied by its residual
  // sum (AffineAdd, writing bf16 for the bf16 convolutions that read it), and gradients in two
  // parts (ReluBackwardSum, BatchNormBackwardSum), as on the CPU.
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.channels_last = true;
    c.deferred_batch_norm = true;
    c.bf16_sums = true;
    c.gradient_parts = true;
    c.device_timers = true;
    return c;
  }

  bool Supports(const Conv2dDesc& d) const override;
  bool Supports(const LinearDesc& d) const override;
  bool Supports(const PoolDesc& d) const;
  // Channels-last batch norm takes bf16 x, y and dx (BatchNormArgs::x_bf16, y_bf16, dx_bf16).
  bool Supports(const BatchNormArgs& a) const override;

  std::shared_ptr<OpPlan> PrepareConv2d(const Conv2dDesc& d) override;
  void Conv2dForward(const OpPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                     Tensor* y) override;
  void Conv2dBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                          Tensor* dx) override;
  void Conv2dBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy, Tensor* dw,
                             Tensor* db, bool accumulate) override;

  std::shared_ptr<OpPlan> PrepareLinear(const LinearDesc& d) override;
  void LinearForward(const OpPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                     Tensor* y) override;
  void LinearBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                          Tensor* dx) override;
  void LinearBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy, Tensor* dw,
                             Tensor* db, bool accumulate) override;

  std::shared_ptr<OpPlan> PreparePool(const PoolDesc& d);
  void PoolForward(const OpPlan& plan, const Tensor& x, Tensor* y, Tensor* ws);
  void PoolBackward(const OpPlan& plan, const Tensor& dy, const Tensor* ws, Tensor* dx);

  void ReluForward(const Tensor& x, Tensor* y);
  void ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx);
  void ReluBackwardSum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, int64_t b_stride,
                       Tensor* dx);
  void AffineAdd(const Tensor& x0, const Tensor* affine0, const Tensor& x1, const Tensor* affine1,
                 bool relu, Tensor* y);
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
  // BatchNormBackward and BatchNormBackwardSum: the gradient dy, or dy + *dy2 (channels-last).
  void BatchNormGrad(const BatchNormArgs& a, const Tensor& x, const Tensor& dy, const Tensor* dy2,
                     const Tensor* relu_y, const Tensor& gamma, const Tensor& save_mean,
                     const Tensor& save_invstd, Tensor* dx, Tensor* dgamma, Tensor* dbeta,
                     bool accumulate);
  // ReluBackward and ReluBackwardSum: gated by an f32 or bf16 y; dy, or dy + *dy2.
  void ReluGrad(const Tensor& y, const Tensor& dy, const Tensor* dy2, Tensor* dx);
  // bn_partials_, at least the size kernels::BatchNormTraining and BatchNormBackward (their
  // channels-last forms with nhwc) need for d.
  double* BatchNormScratch(const BatchNormDims& d, bool nhwc);
  // Makes this backend's device current in the calling thread (a thread other than the one that
  // created the backend starts on device 0, which is only ours under the remap binding).
  void MakeCurrent() const;
  // Frees every handle and pinned buffer (construction failure and destruction).
  void ReleaseHandles() noexcept;
  // cudaStreamSynchronize on the compute stream, then CheckDeferredErrors.
  void SyncStream();
  // Throws the error the device recorded since the last check (a bad label), once.
  void CheckDeferredErrors();
  // Grows the shared cuDNN workspace to at least `bytes` (Prepare time only).
  void ReserveWorkspace(size_t bytes);
  void* Workspace() const { return workspace_.defined() ? workspace_.raw() : nullptr; }

  int ordinal_;
  DeviceIdentity identity_;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  Tensor cublas_workspace_;
  Tensor workspace_;    // cuDNN workspace shared by every plan (one stream: one op at a time)
  Tensor partials_;     // reduction partials (kernels::ReductionPartials() doubles)
  Tensor bn_partials_;  // batch norm's per-part sums, grown on demand (BatchNormScratch)
  Tensor scalars_;      // small device results copied to the host (counts, sums, flags)

  // CopyFromHostAsync: pinned staging slots used round-robin (a micro-step uploads its inputs and
  // its labels, so four slots let the host run two micro-steps ahead before a slot's previous
  // copy must have finished).
  struct Staging {
    void* host = nullptr;  // pinned (cudaHostAlloc)
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // the copy that last read `host`
  };
  static constexpr size_t kStagingSlots = 4;
  std::mutex staging_mu_;
  std::array<Staging, kStagingSlots> staging_{};
  size_t next_staging_ = 0;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;  // where the copy stream joins the compute stream

  // Profile timers: an event pair around each op on the compute stream, read in batches (at most
  // kTimersBeforeRead pairs wait, so the host synchronises at most once every 4,096 ops).
  int64_t StartDeviceTimer() override;
  void StopDeviceTimer(int64_t token, OpStat* stat) noexcept override;
  void FlushDeviceTimers() override;
  void DropDeviceTimers() noexcept override {
    for (OpTimer& t : timers_) t.stat = nullptr;
  }
  cudaEvent_t SpareTimerEvent();
  struct OpTimer {
    cudaEvent_t start = nullptr, stop = nullptr;  // stop: nullptr while the op runs
    OpStat* stat = nullptr;
  };
  static constexpr size_t kTimersBeforeRead = 4096;
  std::vector<OpTimer> timers_;
  std::vector<cudaEvent_t> spare_events_;
  int open_timers_ = 0;

  // SoftmaxCrossEntropy's label check without a synchronisation: the device's sticky
  // kernels::BadLabelCode, copied after each call into pinned memory that SyncStream reads.
  unsigned long long* bad_label_host_ = nullptr;
  int64_t bad_label_classes_ = 0;

  // deterministic, timed_algorithm_search and tf32: a change drops the convolution plans (chosen
  // under the other rule).
  void ApplyOptions(const BackendOptions& next) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (next.deterministic != deterministic_ || next.timed_algorithm_search != timed_search_ ||
        next.tf32 != tf32_) {
      conv_plans_.clear();
    }
    deterministic_ = next.deterministic;
    timed_search_ = next.timed_algorithm_search;
    tf32_ = next.tf32;
  }
  void ReleasePlans() override {
    std::lock_guard<std::mutex> lock(mu_);
    conv_plans_.clear();
    linear_plans_.clear();
    pool_plans_.clear();
  }

  std::mutex mu_;  // guards the plan caches, deterministic_, timed_search_ and tf32_
  bool deterministic_ = false;
  bool timed_search_ = false;
  bool tf32_ = false;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, bool, int, int64_t, int64_t, bool, int>,
           std::shared_ptr<OpPlan>>
      conv_plans_;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, int>, std::shared_ptr<OpPlan>> linear_plans_;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                      bool, bool, bool, bool>,
           std::shared_ptr<OpPlan>>
      pool_plans_;
};

// ---- helpers shared by the backend's .cc files (one per op family) ------------------------------

// Slots of the 64-byte device scalars buffer (CudaBackend::scalars_), each 8-byte aligned: the
// count of CountNonFinite, the sum of SumSquares, SoftmaxCrossEntropy's sticky bad-label code.
inline constexpr size_t kCountSlot = 0, kSumSlot = 8, kBadLabelSlot = 16;
template <class T>
inline T* ScalarSlot(const Tensor& scalars, size_t offset) {
  static_assert(alignof(T) <= 8, "scalar slots are 8-byte aligned");
  return static_cast<T*>(static_cast<void*>(static_cast<char*>(scalars.raw()) + offset));
}

inline void CheckDev(const Tensor& t, const char* what) {
  DPT_CHECK(t.defined() && t.device() == Device::kCuda) << what << ": expected a cuda tensor";
}
inline void CheckF32(const Tensor& t, const char* what) {
  CheckDev(t, what);
  DPT_CHECK(t.dtype() == DType::kF32) << what << ": expected f32, got " << DTypeName(t.dtype());
}
inline void CheckSame(const Tensor& a, const Tensor& b, const char* what) {
  DPT_CHECK(a.numel() == b.numel())
      << what << ": " << a.shape().ToString() << " vs " << b.shape().ToString();
}
// `desc` (an op's descriptor) is formatted only when the check fails: these run on every op.
template <class Desc>
inline void CheckNumel(const Tensor& t, int64_t want, const char* what, const Desc& desc) {
  DPT_CHECK(t.numel() == want) << what << " " << t.shape().ToString() << " for " << desc.ToString();
}
// A 16-bit hand-off's tensor (Conv2dDesc::x_bf16, BatchNormArgs::y_bf16, ...): bf16 where `bf16`
// says so, f32 otherwise, as kernels::Elem.
inline kernels::Elem ExpectElem(const Tensor& t, bool bf16, const char* what) {
  CheckDev(t, what);
  const DType want = bf16 ? DType::kBF16 : DType::kF32;
  DPT_CHECK(t.dtype() == want) << what << ": expected " << DTypeName(want) << ", got "
                               << DTypeName(t.dtype());
  return bf16 ? kernels::Elem::kBF16 : kernels::Elem::kF32;
}
// A tensor that may be either (a residual sum's output, bf16 where only bf16 convolutions read it).
inline kernels::Elem F32OrBf16Elem(const Tensor& t, const char* what) {
  return ExpectElem(t, t.dtype() == DType::kBF16, what);
}

inline bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

inline bool IsHalf(Precision p) { return p != Precision::kF32; }
inline kernels::Half HalfKind(Precision p) {
  return p == Precision::kBF16 ? kernels::Half::kBF16 : kernels::Half::kF16;
}
inline DType HalfDType(Precision p) { return p == Precision::kBF16 ? DType::kBF16 : DType::kF16; }

// The identity of device `ordinal` whose properties are `prop` (cuda_identity.cc): name, UUID as
// nvidia-smi prints it, PCI bus id, memory, compute capability.
DeviceIdentity ReadIdentity(int ordinal, const cudaDeviceProp& prop);

}  // namespace dptrain::cuda
