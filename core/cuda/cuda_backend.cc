// SPDX-License-Identifier: Apache-2.0
// CUDA backend: convolutions on cuDNN's descriptor ("legacy") API with one algorithm per shape
// chosen by cuDNN's heuristics (cudnnGet*Algorithm_v7, the same choice on every rank), linear
// layers on cuBLAS GEMMs, and everything else (pooling, batch norm, losses, optimizer updates,
// elementwise ops, reductions) in kernels.cu over the shared math of core/elementwise.h.
//
// Numerics: fp32 descriptors use FMA-only math (cuDNN CUDNN_FMA_MATH; cuBLAS CUBLAS_COMPUTE_32F,
// which never uses TF32), so fp32 results match the CPU reference within fp32 tolerance; with
// BackendOptions::tf32 (train.tf32, on by default in a run as in PyTorch) fp32 convolutions may
// run TF32 on tensor cores (CUDNN_DEFAULT_MATH), while GEMMs stay fp32. bf16 and
// fp16 precision convert f32 operands to 16-bit staging buffers and run tensor-core math with
// f32 accumulation; GEMM outputs and linear weight gradients stay f32, cuDNN's outputs (and conv
// weight gradients) come back in 16 bits and are widened to f32. bf16 needs compute capability 8.0.
//
// This file: the device allocator, construction, copies, Supports() and the public functions of
// cuda_backend.h. The ops live in one file per family: cuda_conv.cc (cuDNN; its algorithm search
// in cuda_conv_algo.cc), cuda_linear.cc (cuBLAS), cuda_pool.cc, cuda_elementwise.cc (elementwise,
// optimizer updates, checks) and cuda_norm_loss.cc (batch norm, losses); the device identity is
// in cuda_identity.cc.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/cublas_loader.h"
#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_interop.h"
#include "core/cuda/cuda_rules.h"
#include "core/cuda/kernels.h"
#include "core/error.h"
#include "core/op_dispatch.h"

namespace dptrain::cuda {
namespace {

// ---- device memory ------------------------------------------------------------------------------

class CudaRawAllocator final : public RawAllocator {
 public:
  explicit CudaRawAllocator(int ordinal) : ordinal_(ordinal) {
    DPT_CUDA_CHECK(cudaSetDevice(ordinal));
    size_t free = 0, total = 0;
    DPT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    capacity_ = total;
  }
  void* Alloc(size_t bytes) noexcept override {
    (void)cudaSetDevice(ordinal_);  // the calling thread may not have made it current
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaSuccess) return p;
    // Clear the error so the next launch check does not report it; the caching allocator frees
    // its cache and retries, then throws OutOfMemory with its report.
    (void)cudaGetLastError();
    if (e != cudaErrorMemoryAllocation) {
      detail::Warn("cudaMalloc", detail::CudaErrorText(e), __FILE__, __LINE__);
    }
    return nullptr;
  }
  void Free(void* ptr) noexcept override { DPT_CUDA_WARN(cudaFree(ptr)); }
  Device device() const override { return Device::kCuda; }
  size_t Capacity() const override { return capacity_; }

  // Fences are events recorded on the other stream. If one cannot be made, the device is
  // synchronised instead, so that "no fence" is still a correct "done".
  void* RecordFence(void* stream) noexcept override {
    (void)cudaSetDevice(ordinal_);
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess) {
      if (cudaEventRecord(e, static_cast<cudaStream_t>(stream)) == cudaSuccess) return e;
      (void)cudaEventDestroy(e);
    }
    (void)cudaGetLastError();
    DPT_CUDA_WARN(cudaDeviceSynchronize());
    return nullptr;
  }
  bool FenceDone(void* fence) noexcept override {
    if (fence == nullptr) return true;
    const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(fence));
    if (q == cudaErrorNotReady) return false;
    // Any other error is sticky or reported by the next checked call; the block is not reused
    // by work that could still run on a broken context.
    if (q != cudaSuccess) (void)cudaGetLastError();
    return true;
  }
  void DestroyFence(void* fence) noexcept override {
    if (fence != nullptr) DPT_CUDA_WARN(cudaEventDestroy(static_cast<cudaEvent_t>(fence)));
  }

 private:
  int ordinal_;
  size_t capacity_ = 0;
};

std::unique_ptr<CachingAllocator> MakeAllocator(int ordinal) {
  return std::make_unique<CachingAllocator>(std::make_unique<CudaRawAllocator>(ordinal));
}

}  // namespace

// ---- construction -------------------------------------------------------------------------------

CudaBackend::CudaBackend(int ordinal) : Backend(MakeAllocator(ordinal)), ordinal_(ordinal) {
  try {
    cudaDeviceProp prop{};
    DPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    identity_ = ReadIdentity(ordinal, prop);

    DPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DPT_CUDNN_CHECK(cudnnCreate(&cudnn_));
    DPT_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    const CublasApi& blas = Cublas();  // loaded here, on the first CUDA backend
    DPT_CUBLAS_CHECK(blas.create(&cublas_));
    // cublasSetStream resets the workspace to cuBLAS's own pool, so the stream comes first.
    DPT_CUBLAS_CHECK(blas.set_stream(cublas_, stream_));
    // No TF32: fp32 GEMMs run in fp32 (CUBLAS_COMPUTE_32F is passed to every call as well).
    DPT_CUBLAS_CHECK(blas.set_math_mode(cublas_, CUBLAS_DEFAULT_MATH));
    // cuBLAS's workspace from our allocator (recommended: 32 MiB on Hopper and newer, 4 MiB
    // before), so every device allocation is accounted for.
    const size_t cublas_ws = prop.major >= 9 ? (size_t{32} << 20) : (size_t{4} << 20);
    cublas_workspace_ =
        Empty(Shape{static_cast<int64_t>(cublas_ws)}, DType::kU8, "cuBLAS workspace");
    DPT_CUBLAS_CHECK(blas.set_workspace(cublas_, cublas_workspace_.raw(), cublas_ws));
    partials_ = Empty(Shape{kernels::ReductionPartials() * 8}, DType::kU8, "reduction partials");
    scalars_ = Empty(Shape{64}, DType::kU8, "device scalars");
    // No bad label yet: the sticky code starts at kNoBadLabel (all bits set), on both sides.
    DPT_CUDA_CHECK(cudaMemsetAsync(ScalarSlot<unsigned long long>(scalars_, kBadLabelSlot), 0xff,
                                   sizeof(unsigned long long), stream_));
    DPT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&bad_label_host_),
                                 sizeof(unsigned long long), cudaHostAllocDefault));
    *bad_label_host_ = kernels::kNoBadLabel;
    DPT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    DPT_CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
    for (Staging& slot : staging_) {
      DPT_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    }
    DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    ReleaseHandles();
    throw;
  }
}

CudaBackend::~CudaBackend() {
  DPT_CUDA_WARN(cudaStreamSynchronize(stream_));
  if (copy_stream_ != nullptr) DPT_CUDA_WARN(cudaStreamSynchronize(copy_stream_));
  ReleaseHandles();
}

void CudaBackend::ReleaseHandles() noexcept {
  for (const OpTimer& t : timers_) {
    if (t.start != nullptr) (void)cudaEventDestroy(t.start);
    if (t.stop != nullptr) (void)cudaEventDestroy(t.stop);
  }
  for (cudaEvent_t e : spare_events_) (void)cudaEventDestroy(e);
  timers_.clear();
  spare_events_.clear();
  open_timers_ = 0;
  for (Staging& slot : staging_) {
    if (slot.host != nullptr) (void)cudaFreeHost(slot.host);
    if (slot.done != nullptr) (void)cudaEventDestroy(slot.done);
    slot = Staging{};
  }
  if (compute_mark_ != nullptr) (void)cudaEventDestroy(compute_mark_);
  if (copy_stream_ != nullptr) (void)cudaStreamDestroy(copy_stream_);
  if (bad_label_host_ != nullptr) (void)cudaFreeHost(bad_label_host_);
  if (cublas_ != nullptr) {  // created, so the library is loaded: TryCublas cannot fail here
    if (const CublasApi* blas = TryCublas(nullptr)) (void)blas->destroy(cublas_);
  }
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  compute_mark_ = nullptr;
  copy_stream_ = nullptr;
  bad_label_host_ = nullptr;
  cublas_ = nullptr;
  cudnn_ = nullptr;
  stream_ = nullptr;
}

void CudaBackend::SyncStream() {
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  CheckDeferredErrors();
}

void CudaBackend::CheckDeferredErrors() {
  const unsigned long long code = *bad_label_host_;
  if (code == kernels::kNoBadLabel) return;
  // Reported once: the device's sticky code is reset behind everything queued so far.
  *bad_label_host_ = kernels::kNoBadLabel;
  DPT_CUDA_CHECK(cudaMemsetAsync(ScalarSlot<unsigned long long>(scalars_, kBadLabelSlot), 0xff,
                                 sizeof(unsigned long long), stream_));
  const auto row = static_cast<int64_t>(code >> 32);
  const auto label = static_cast<int32_t>(static_cast<uint32_t>(code & 0xffffffffu));
  DPT_THROW(DataError) << "label " << label << " of sample " << row
                       << " in the batch is outside [0, " << bad_label_classes_ << ")";
}

void CudaBackend::MakeCurrent() const {
  if (ordinal_ != 0) DPT_CUDA_CHECK(cudaSetDevice(ordinal_));
}

void CudaBackend::ReserveWorkspace(size_t bytes) {
  if (bytes == 0 || (workspace_.defined() && workspace_.bytes() >= bytes)) return;
  // The old buffer may still be in use by queued work; it returns to the cache and is only
  // handed out again to work queued behind that (one stream).
  workspace_ = Tensor();
  workspace_ = Empty(Shape{static_cast<int64_t>(bytes)}, DType::kU8, "cuDNN workspace");
}

// ---- memory and copies --------------------------------------------------------------------------

void CudaBackend::CopyFromHost(const void* src, Tensor* dst) {
  OpScope scope(this, "copy_h2d");
  MakeCurrent();
  CheckDev(*dst, "CopyFromHost");
  if (dst->bytes() == 0) return;
  DPT_CUDA_CHECK(cudaMemcpyAsync(dst->raw(), src, dst->bytes(), cudaMemcpyHostToDevice, stream_));
  // Blocking, as on the CPU: the caller may reuse `src` as soon as this returns. (From pageable
  // memory the copy is staged anyway; from pinned memory it would otherwise still be reading.)
  SyncStream();
}

void CudaBackend::CopyFromHostAsync(const void* src, Tensor* dst) {
  OpScope scope(this, "copy_h2d_async");
  MakeCurrent();
  CheckDev(*dst, "CopyFromHostAsync");
  const size_t bytes = dst->bytes();
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(staging_mu_);
  Staging& slot = staging_[next_staging_];
  next_staging_ = (next_staging_ + 1) % kStagingSlots;
  // The copy that last read this slot was queued kStagingSlots uploads ago: normally long done.
  DPT_CUDA_CHECK(cudaEventSynchronize(slot.done));
  if (slot.bytes < bytes) {
    if (slot.host != nullptr) DPT_CUDA_CHECK(cudaFreeHost(slot.host));
    slot.host = nullptr;
    slot.bytes = 0;
    DPT_CUDA_CHECK(cudaHostAlloc(&slot.host, bytes, cudaHostAllocDefault));
    slot.bytes = bytes;
  }
  std::memcpy(slot.host, src, bytes);
  // The copy stream joins the compute stream here (queued work may still read `dst`), and the
  // compute stream's later work waits for the copy. `dst`'s block is used by the copy stream
  // only between those two points, so the allocator needs no RecordStream for it.
  DPT_CUDA_CHECK(cudaEventRecord(compute_mark_, stream_));
  DPT_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, compute_mark_, 0));
  DPT_CUDA_CHECK(
      cudaMemcpyAsync(dst->raw(), slot.host, bytes, cudaMemcpyHostToDevice, copy_stream_));
  DPT_CUDA_CHECK(cudaEventRecord(slot.done, copy_stream_));
  DPT_CUDA_CHECK(cudaStreamWaitEvent(stream_, slot.done, 0));
}

void CudaBackend::CopyToHost(const Tensor& src, void* dst) {
  OpScope scope(this, "copy_d2h");
  MakeCurrent();
  CheckDev(src, "CopyToHost");
  if (src.bytes() == 0) return;
  DPT_CUDA_CHECK(cudaMemcpyAsync(dst, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, stream_));
  SyncStream();
}

void CudaBackend::Copy(const Tensor& src, Tensor* dst) {
  OpScope scope(this, "copy");
  MakeCurrent();
  CheckDev(src, "Copy src");
  CheckDev(*dst, "Copy dst");
  DPT_CHECK(src.bytes() == dst->bytes()) << src.bytes() << " vs " << dst->bytes();
  if (src.raw() == dst->raw() || src.bytes() == 0) return;
  const char* a = static_cast<const char*>(src.raw());
  const char* b = static_cast<const char*>(dst->raw());
  DPT_CHECK(a + src.bytes() <= b || b + dst->bytes() <= a) << "Copy between overlapping tensors";
  DPT_CUDA_CHECK(
      cudaMemcpyAsync(dst->raw(), src.raw(), src.bytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::CopyColumns(const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col,
                              int64_t cols) {
  OpScope scope(this, "copy_columns");
  MakeCurrent();
  CheckDev(src, "CopyColumns src");
  CheckDev(*dst, "CopyColumns dst");
  const ColumnCopy c = CheckColumnCopy(src, src_col, *dst, dst_col, cols);
  if (c.rows == 0 || cols == 0) return;
  // One strided copy engine transfer: rows of `cols` floats between row pitches.
  constexpr size_t kF = sizeof(float);
  DPT_CUDA_CHECK(
      cudaMemcpy2DAsync(dst->data<float>() + dst_col, static_cast<size_t>(c.dst_pitch) * kF,
                        src.data<float>() + src_col, static_cast<size_t>(c.src_pitch) * kF,
                        static_cast<size_t>(cols) * kF, static_cast<size_t>(c.rows),
                        cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::Zero(Tensor* t) {
  MakeCurrent();
  CheckDev(*t, "Zero");
  if (t->bytes() > 0) DPT_CUDA_CHECK(cudaMemsetAsync(t->raw(), 0, t->bytes(), stream_));
}

void CudaBackend::Fill(Tensor* t, float value) {
  CheckF32(*t, "Fill");
  kernels::Fill(t->data<float>(), t->numel(), value, stream_);
}

void CudaBackend::Run(const Op& op) { RunOp(*this, op); }
bool CudaBackend::Supports(const PlanDesc& d) const { return SupportsPlanned(*this, d); }
std::shared_ptr<OpPlan> CudaBackend::Prepare(const PlanDesc& d) { return PrepareOp(*this, d); }
void CudaBackend::Run(const OpPlan& plan, const PlannedOp& op) { RunPlannedOp(*this, plan, op); }

void CudaBackend::Synchronize() {
  MakeCurrent();
  SyncStream();
}

// ---- profile timers -----------------------------------------------------------------------------

cudaEvent_t CudaBackend::SpareTimerEvent() {
  if (!spare_events_.empty()) {
    cudaEvent_t e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  DPT_CUDA_CHECK(cudaEventCreate(&e));  // with timing (cudaEventDefault)
  return e;
}

int64_t CudaBackend::StartDeviceTimer() {
  // Read the finished timers now and then, between ops (none open), so they do not pile up.
  if (open_timers_ == 0 && timers_.size() >= kTimersBeforeRead) FlushDeviceTimers();
  MakeCurrent();
  OpTimer t;
  t.start = SpareTimerEvent();
  const cudaError_t e = cudaEventRecord(t.start, stream_);
  if (e != cudaSuccess) {
    spare_events_.push_back(t.start);
    DPT_CUDA_CHECK(e);
  }
  timers_.push_back(t);
  ++open_timers_;
  return static_cast<int64_t>(timers_.size()) - 1;
}

void CudaBackend::StopDeviceTimer(int64_t token, OpStat* stat) noexcept {
  if (token < 0 || static_cast<size_t>(token) >= timers_.size()) return;
  OpTimer& t = timers_[static_cast<size_t>(token)];
  --open_timers_;
  try {
    cudaEvent_t stop = SpareTimerEvent();
    if (cudaEventRecord(stop, stream_) != cudaSuccess) {
      (void)cudaGetLastError();  // so that no later launch check reports it as its own
      spare_events_.push_back(stop);
      return;  // dropped: the timer stays without a stop and is not read
    }
    t.stop = stop;
    t.stat = stat;
  } catch (...) {
    // dropped (no event to be had): the error resurfaces at the next checked call
  }
}

void CudaBackend::FlushDeviceTimers() {
  if (timers_.empty() || open_timers_ != 0) return;
  MakeCurrent();
  std::vector<OpTimer> timers;
  timers.swap(timers_);
  // Every timer's events go back to the spares, read or not (an error below still throws).
  struct Recycle {
    std::vector<OpTimer>& timers;
    std::vector<cudaEvent_t>& spare;
    ~Recycle() {
      for (const OpTimer& t : timers) {
        spare.push_back(t.start);
        if (t.stop != nullptr) spare.push_back(t.stop);
      }
    }
  } recycle{timers, spare_events_};
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (const OpTimer& t : timers) {
    if (t.stop == nullptr || t.stat == nullptr) continue;
    float ms = 0;
    DPT_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
    t.stat->seconds += static_cast<double>(ms) * 1e-3;
  }
}

// ---- support ------------------------------------------------------------------------------------

// cuDNN's legacy descriptors take int dimensions and strides (ConvFitsLegacyDescriptors,
// cuda_rules.h). bf16 tensor-core math needs compute capability 8.0; fp16 runs on every
// architecture this binary is built for (7.5+). Activations are NCHW here (PrefersChannelsLast
// is false: 16-bit convolutions go channels-last inside the op, cuda_conv.cc).
// Any mix of layouts (Convert stages what the plan's layout does not take as it is); bf16
// hand-offs in bf16 precision, where cuDNN reads x and dy and writes y in bf16 as they are: a bf16
// y without a bias or ReLU to add (the batch norm after it has them), a bf16 dy without a bias
// gradient to sum. No sampled input gradient (dx_sub).
bool CudaBackend::Supports(const Conv2dDesc& d) const {
  const bool bf16 = d.precision == Precision::kBF16;
  if (!bf16 && (d.x_bf16 || d.y_bf16 || d.dy_bf16)) return false;
  if (d.y_bf16 && (d.relu || d.bias)) return false;
  if (d.dy_bf16 && d.bias) return false;
  return ConvFitsLegacyDescriptors(d) && !d.dx_sub && (!bf16 || identity_.cc_major >= 8);
}

bool CudaBackend::Supports(const LinearDesc& d) const {
  return d.n > 0 && d.in > 0 && d.out > 0 && FitsInt(d.n) && FitsInt(d.in) && FitsInt(d.out) &&
         (d.precision != Precision::kBF16 || identity_.cc_major >= 8);
}

// Own kernels (kernels.cu): 64-bit indexing, but max pooling stores each window's argmax as an
// int32 position within its H x W plane.
// A bf16 input gradient from max pooling whose windows do not overlap (PoolDesc::dx_bf16).
bool CudaBackend::Supports(const PoolDesc& d) const {
  return d.Valid() && (d.nhwc || !d.y_nchw) &&
         (!d.dx_bf16 || (d.kind == PoolKind::kMax && d.stride >= d.kernel)) &&
         static_cast<double>(d.h) * static_cast<double>(d.w) <= INT_MAX;
}

// ---- the public functions of cuda_backend.h -----------------------------------------------------

bool DeviceAvailable(std::string* why) {
  int count = 0;  // left untouched when there is no driver
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why != nullptr) {
      *why = std::string("no CUDA device (") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) +
             ")";
    }
    return false;
  }
  if (count <= 0) {
    if (why != nullptr) {
      const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
      *why = std::string("no CUDA device (the CUDA runtime counts 0") +
             (v != nullptr ? std::string("; CUDA_VISIBLE_DEVICES='") + v + "'" : "") + ")";
    }
    return false;
  }
  return true;
}

std::unique_ptr<Backend> CreateCudaBackend(int ordinal) {
  return std::make_unique<CudaBackend>(ordinal);
}

bool IsCudaBackend(const Backend& backend) {
  return dynamic_cast<const CudaBackend*>(&backend) != nullptr;
}

namespace {
const CudaBackend& AsCuda(const Backend& backend, const char* what) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  DPT_CHECK(cuda != nullptr) << what << ": backend '" << backend.name() << "' is not cuda";
  return *cuda;
}
}  // namespace

int OrdinalOf(const Backend& backend) { return AsCuda(backend, "OrdinalOf").ordinal(); }

cudaStream_t ComputeStreamOf(const Backend& backend) {
  return AsCuda(backend, "ComputeStreamOf").stream();
}

std::vector<std::pair<std::string, std::string>> LibraryVersions() {
  auto major_minor = [](int v) {  // 12080 -> "12.8"
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  };
  std::vector<std::pair<std::string, std::string>> out;
  int rt = 0;
  if (cudaRuntimeGetVersion(&rt) != cudaSuccess) (void)cudaGetLastError();
  out.emplace_back("CUDA runtime", rt > 0 ? major_minor(rt) : "unknown");
  int drv = 0;
  if (cudaDriverGetVersion(&drv) != cudaSuccess) (void)cudaGetLastError();
  out.emplace_back("CUDA driver", drv > 0 ? major_minor(drv) : "none");
  const size_t dnn = cudnnGetVersion();  // major * 10000 + minor * 100 + patch (cuDNN 9)
  out.emplace_back("cuDNN", std::to_string(dnn / 10000) + "." + std::to_string(dnn % 10000 / 100) +
                                "." + std::to_string(dnn % 100));
  int bmaj = 0, bmin = 0, bpat = 0;
  std::string why;
  const CublasApi* blas = TryCublas(&why);
  if (blas == nullptr) {
    out.emplace_back("cuBLAS", "not loadable (" + why + ")");
  } else if (blas->get_property(MAJOR_VERSION, &bmaj) == CUBLAS_STATUS_SUCCESS &&
             blas->get_property(MINOR_VERSION, &bmin) == CUBLAS_STATUS_SUCCESS &&
             blas->get_property(PATCH_LEVEL, &bpat) == CUBLAS_STATUS_SUCCESS) {
    out.emplace_back(
        "cuBLAS", std::to_string(bmaj) + "." + std::to_string(bmin) + "." + std::to_string(bpat));
  } else {
    out.emplace_back("cuBLAS", "unknown");
  }
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {  // major * 10000 + minor * 100 + patch
    out.emplace_back("NCCL", std::to_string(nccl / 10000) + "." +
                                 std::to_string(nccl % 10000 / 100) + "." +
                                 std::to_string(nccl % 100));
  } else {
    out.emplace_back("NCCL", "unknown");
  }
  return out;
}

}  // namespace dptrain::cuda
