// SPDX-License-Identifier: Apache-2.0
// CUDA backend: convolutions on cuDNN's descriptor ("legacy") API with one algorithm per shape
// chosen by cuDNN's heuristics (cudnnGet*Algorithm_v7, the same choice on every rank), linear
// layers on cuBLAS GEMMs, and everything else (pooling, batch norm, losses, optimizer updates,
// elementwise ops, reductions) in kernels.cu over the shared math of core/elementwise.h.
//
// Numerics: fp32 descriptors use FMA-only math (cuDNN CUDNN_FMA_MATH; cuBLAS CUBLAS_COMPUTE_32F,
// which never uses TF32), so fp32 results match the CPU reference within fp32 tolerance. bf16 and
// fp16 precision convert f32 operands to 16-bit staging buffers and run tensor-core math with
// f32 accumulation; GEMM outputs and linear weight gradients stay f32, cuDNN's outputs (and conv
// weight gradients) come back in 16 bits and are widened to f32. bf16 needs compute capability 8.0.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_interop.h"
#include "core/cuda/kernels.h"
#include "core/error.h"

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

// Slots of the 64-byte device scalars buffer (CudaBackend::scalars_), each 8-byte aligned: the
// count of CountNonFinite, the sum of SumSquares, the first bad label row of SoftmaxCrossEntropy.
constexpr size_t kCountSlot = 0, kSumSlot = 8, kBadRowSlot = 16;
template <class T>
T* ScalarSlot(const Tensor& scalars, size_t offset) {
  static_assert(alignof(T) <= 8, "scalar slots are 8-byte aligned");
  return static_cast<T*>(static_cast<void*>(static_cast<char*>(scalars.raw()) + offset));
}

std::unique_ptr<CachingAllocator> MakeAllocator(int ordinal) {
  return std::make_unique<CachingAllocator>(std::make_unique<CudaRawAllocator>(ordinal));
}

void CheckDev(const Tensor& t, const char* what) {
  DPT_CHECK(t.defined() && t.device() == Device::kCuda) << what << ": expected a cuda tensor";
}
void CheckF32(const Tensor& t, const char* what) {
  CheckDev(t, what);
  DPT_CHECK(t.dtype() == DType::kF32) << what << ": expected f32, got " << DTypeName(t.dtype());
}
void CheckSame(const Tensor& a, const Tensor& b, const char* what) {
  DPT_CHECK(a.numel() == b.numel())
      << what << ": " << a.shape().ToString() << " vs " << b.shape().ToString();
}
void CheckNumel(const Tensor& t, int64_t want, const char* what, const std::string& desc) {
  DPT_CHECK(t.numel() == want) << what << " " << t.shape().ToString() << " for " << desc;
}

bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

std::string FormatUuid(const cudaUUID_t& u) {
  static const char* hex = "0123456789abcdef";
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    const auto b = static_cast<unsigned char>(u.bytes[i]);
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

// ---- cuDNN descriptors (RAII) -------------------------------------------------------------------

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { DPT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  void Set(cudnnDataType_t t, int64_t n, int64_t c, int64_t h, int64_t w) {
    DPT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, t, static_cast<int>(n),
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

bool IsHalf(Precision p) { return p != Precision::kF32; }
kernels::Half HalfKind(Precision p) {
  return p == Precision::kBF16 ? kernels::Half::kBF16 : kernels::Half::kF16;
}
DType HalfDType(Precision p) { return p == Precision::kBF16 ? DType::kBF16 : DType::kF16; }

struct ConvPlan final : OpPlan {
  Conv2dDesc d;
  bool half = false;
  kernels::Half kind = kernels::Half::kBF16;
  TensorDesc x, y;                     // in the compute data type
  TensorDesc y32;                      // the f32 output, for the bias add and the bias gradient
  TensorDesc b32;                      // (1, K, 1, 1) f32
  FilterDesc w;                        // in the compute data type
  ConvDesc fwd, bwd_data, bwd_filter;  // one per op: each carries its algorithm's math type
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
  // bf16/fp16 staging, reused across the three ops (one stream: one op at a time):
  // x16 holds x or dx, y16 holds y or dy, w16 holds w or dw.
  Tensor x16, y16, w16;
};

struct LinearPlan final : OpPlan {
  LinearDesc d;
  bool half = false;
  kernels::Half kind = kernels::Half::kBF16;
  cudaDataType_t ab = CUDA_R_32F;  // GEMM operand type
  Tensor x16, w16, dy16;
};

struct PoolPlan final : OpPlan {
  PoolDesc d;
  kernels::PoolGeom g{};
};

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

// ---- construction -------------------------------------------------------------------------------

CudaBackend::CudaBackend(int ordinal) : Backend(MakeAllocator(ordinal)), ordinal_(ordinal) {
  try {
    cudaDeviceProp prop{};
    DPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    identity_.ordinal = ordinal;
    identity_.name = prop.name;
    identity_.uuid = FormatUuid(prop.uuid);
    identity_.memory_total = prop.totalGlobalMem;
    identity_.cc_major = prop.major;
    identity_.cc_minor = prop.minor;
    char bus[32] = {0};
    DPT_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal));
    identity_.pci_bus_id = bus;

    DPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DPT_CUDNN_CHECK(cudnnCreate(&cudnn_));
    DPT_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    DPT_CUBLAS_CHECK(cublasCreate(&cublas_));
    // cublasSetStream resets the workspace to cuBLAS's own pool, so the stream comes first.
    DPT_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // No TF32: fp32 GEMMs run in fp32 (CUBLAS_COMPUTE_32F is passed to every call as well).
    DPT_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    // cuBLAS's workspace from our allocator (recommended: 32 MiB on Hopper and newer, 4 MiB
    // before), so every device allocation is accounted for.
    const size_t cublas_ws = prop.major >= 9 ? (size_t{32} << 20) : (size_t{4} << 20);
    cublas_workspace_ =
        Empty(Shape{static_cast<int64_t>(cublas_ws)}, DType::kU8, "cuBLAS workspace");
    DPT_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.raw(), cublas_ws));
    partials_ = Empty(Shape{kernels::ReductionPartials() * 8}, DType::kU8, "reduction partials");
    scalars_ = Empty(Shape{64}, DType::kU8, "device scalars");
  } catch (...) {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    throw;
  }
}

CudaBackend::~CudaBackend() {
  DPT_CUDA_WARN(cudaStreamSynchronize(stream_));
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
  DPT_CUDA_WARN(cudaStreamDestroy(stream_));
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
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::CopyToHost(const Tensor& src, void* dst) {
  OpScope scope(this, "copy_d2h");
  MakeCurrent();
  CheckDev(src, "CopyToHost");
  if (src.bytes() == 0) return;
  DPT_CUDA_CHECK(cudaMemcpyAsync(dst, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, stream_));
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
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

void CudaBackend::Zero(Tensor* t) {
  MakeCurrent();
  CheckDev(*t, "Zero");
  if (t->bytes() > 0) DPT_CUDA_CHECK(cudaMemsetAsync(t->raw(), 0, t->bytes(), stream_));
}

void CudaBackend::Fill(Tensor* t, float value) {
  CheckF32(*t, "Fill");
  kernels::Fill(t->data<float>(), t->numel(), value, stream_);
}

void CudaBackend::Synchronize() {
  MakeCurrent();
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- support ------------------------------------------------------------------------------------

// cuDNN's descriptor API and cuBLAS take int dimensions, and a 4-d tensor descriptor's strides
// are ints too, so every element count of a conv operand must fit. bf16 tensor-core math needs
// compute capability 8.0; fp16 runs on every architecture this binary is built for (7.5+).
bool CudaBackend::Supports(const Conv2dDesc& d) const {
  const bool shape = d.n > 0 && d.c > 0 && d.h > 0 && d.w > 0 && d.k > 0 && d.r > 0 && d.s > 0 &&
                     d.stride > 0 && d.pad >= 0 && d.out_h() > 0 && d.out_w() > 0;
  if (!shape) return false;
  const bool ints = FitsInt(d.n) && FitsInt(d.c) && FitsInt(d.h) && FitsInt(d.w) && FitsInt(d.k) &&
                    FitsInt(d.r) && FitsInt(d.s) && FitsInt(d.stride) && FitsInt(d.pad);
  if (!ints) return false;
  // Products in double: they cannot overflow, and int range is far inside double's exact range.
  const auto numel = [](int64_t a, int64_t b, int64_t c, int64_t e) {
    return static_cast<double>(a) * static_cast<double>(b) * static_cast<double>(c) *
           static_cast<double>(e);
  };
  const bool counts = numel(d.n, d.c, d.h, d.w) <= INT_MAX &&
                      numel(d.n, d.k, d.out_h(), d.out_w()) <= INT_MAX &&
                      numel(d.k, d.c, d.r, d.s) <= INT_MAX;
  const bool precision = d.precision != Precision::kBF16 || identity_.cc_major >= 8;
  return counts && precision;
}

bool CudaBackend::Supports(const LinearDesc& d) const {
  return d.n > 0 && d.in > 0 && d.out > 0 && FitsInt(d.n) && FitsInt(d.in) && FitsInt(d.out) &&
         (d.precision != Precision::kBF16 || identity_.cc_major >= 8);
}

// Own kernels (kernels.cu): 64-bit indexing, but max pooling stores each window's argmax as an
// int32 position within its H x W plane.
bool CudaBackend::Supports(const PoolDesc& d) const {
  return d.n > 0 && d.c > 0 && d.h > 0 && d.w > 0 && d.kernel > 0 && d.stride > 0 && d.pad >= 0 &&
         d.pad * 2 <= d.kernel && d.out_h() > 0 && d.out_w() > 0 &&
         static_cast<double>(d.h) * static_cast<double>(d.w) <= INT_MAX;
}

// ---- conv2d -------------------------------------------------------------------------------------

std::shared_ptr<OpPlan> CudaBackend::PrepareConv2d(const Conv2dDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cuda: conv2d " << d.ToString();
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = conv_plans_[std::make_tuple(d.n, d.c, d.h, d.w, d.k, d.r, d.s, d.stride, d.pad,
                                           d.bias, static_cast<int>(d.precision))];
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
  p->x.Set(dt, d.n, d.c, d.h, d.w);
  p->y.Set(dt, d.n, d.k, P, Q);
  p->y32.Set(CUDNN_DATA_FLOAT, d.n, d.k, P, Q);
  p->b32.Set(CUDNN_DATA_FLOAT, 1, d.k, 1, 1);
  DPT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w.d, dt, CUDNN_TENSOR_NCHW, static_cast<int>(d.k),
                                             static_cast<int>(d.c), static_cast<int>(d.r),
                                             static_cast<int>(d.s)));
  // Cross-correlation (no kernel flip), as PyTorch's Conv2d; f32 accumulation in every precision.
  // fp32: FMA-only kernels (CUDNN_DEFAULT_MATH would allow TF32 on Ampere and newer).
  const cudnnMathType_t math = p->half ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  for (ConvDesc* c : {&p->fwd, &p->bwd_data, &p->bwd_filter}) {
    DPT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        c->d, static_cast<int>(d.pad), static_cast<int>(d.pad), static_cast<int>(d.stride),
        static_cast<int>(d.stride), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(c->d, math));
  }
  int on = 0, oc = 0, oh = 0, ow = 0;
  DPT_CUDNN_CHECK(
      cudnnGetConvolution2dForwardOutputDim(p->fwd.d, p->x.d, p->w.d, &on, &oc, &oh, &ow));
  DPT_CHECK(on == d.n && oc == d.k && oh == P && ow == Q)
      << "cuDNN computes output (" << on << "," << oc << "," << oh << "," << ow << ") for "
      << d.ToString();

  // Algorithms: cuDNN's heuristics (no benchmarking, so every rank picks the same ones);
  // deterministic backward algorithms so reruns and ranks agree bit for bit.
  const size_t cap = std::min<size_t>(size_t{1} << 30, identity_.memory_total / 8);
  const bool fp32 = !p->half;
  auto fail = [&](const char* what) {
    DPT_THROW(UnsupportedError) << "cuda: cuDNN offers no usable " << what << " algorithm for "
                                << d.ToString();
  };
  {
    int max = 0, got = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(cudnn_, &max));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perfs(static_cast<size_t>(std::max(max, 1)));
    DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, p->x.d, p->w.d, p->fwd.d, p->y.d,
                                                           static_cast<int>(perfs.size()), &got,
                                                           perfs.data()));
    perfs.resize(static_cast<size_t>(got));
    const auto* best = PickAlgo(perfs, fp32, false, cap);
    if (best == nullptr) fail("forward");
    p->fwd_algo = best->algo;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->fwd.d, fp32 ? math : best->mathType));
    DPT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cudnn_, p->x.d, p->w.d, p->fwd.d,
                                                            p->y.d, p->fwd_algo, &p->fwd_ws));
  }
  {
    int max = 0, got = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnn_, &max));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(static_cast<size_t>(std::max(max, 1)));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        cudnn_, p->w.d, p->y.d, p->bwd_data.d, p->x.d, static_cast<int>(perfs.size()), &got,
        perfs.data()));
    perfs.resize(static_cast<size_t>(got));
    const auto* best = PickAlgo(perfs, fp32, true, cap);
    if (best == nullptr) fail("backward-data");
    p->data_algo = best->algo;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->bwd_data.d, fp32 ? math : best->mathType));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
        cudnn_, p->w.d, p->y.d, p->bwd_data.d, p->x.d, p->data_algo, &p->data_ws));
  }
  {
    int max = 0, got = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnn_, &max));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perfs(static_cast<size_t>(std::max(max, 1)));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        cudnn_, p->x.d, p->y.d, p->bwd_filter.d, p->w.d, static_cast<int>(perfs.size()), &got,
        perfs.data()));
    perfs.resize(static_cast<size_t>(got));
    const auto* best = PickAlgo(perfs, fp32, true, cap);
    if (best == nullptr) fail("backward-filter");
    p->filter_algo = best->algo;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(p->bwd_filter.d, fp32 ? math : best->mathType));
    DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        cudnn_, p->x.d, p->y.d, p->bwd_filter.d, p->w.d, p->filter_algo, &p->filter_ws));
  }
  ReserveWorkspace(std::max({p->fwd_ws, p->data_ws, p->filter_ws}));
  if (p->half) {
    const DType ht = HalfDType(d.precision);
    p->x16 = Empty(Shape{d.n * d.c * d.h * d.w}, ht, "conv2d 16-bit x/dx");
    p->y16 = Empty(Shape{d.n * d.k * P * Q}, ht, "conv2d 16-bit y/dy");
    p->w16 = Empty(Shape{d.k * d.c * d.r * d.s}, ht, "conv2d 16-bit w/dw");
  }
  slot = p;
  return p;
}

void CudaBackend::Conv2dForward(const OpPlan& plan, const Tensor& x, const Tensor& w,
                                const Tensor* b, Tensor* y) {
  OpScope scope(this, "conv2d_fwd");
  const auto& p = static_cast<const ConvPlan&>(plan);
  const Conv2dDesc& d = p.d;
  CheckF32(x, "conv2d x");
  CheckF32(w, "conv2d w");
  CheckF32(*y, "conv2d y");
  CheckNumel(x, d.n * d.c * d.h * d.w, "conv2d x", d.ToString());
  CheckNumel(w, d.k * d.c * d.r * d.s, "conv2d w", d.ToString());
  CheckNumel(*y, d.n * d.k * d.out_h() * d.out_w(), "conv2d y", d.ToString());
  DPT_CHECK(!d.bias || b != nullptr) << "conv2d with bias needs a bias tensor";
  const float one = 1.f, zero = 0.f;
  const void* xin = x.raw();
  const void* win = w.raw();
  void* yout = y->raw();
  if (p.half) {
    kernels::F32ToHalf(p.kind, x.data<float>(), p.x16.raw(), x.numel(), stream_);
    kernels::F32ToHalf(p.kind, w.data<float>(), p.w16.raw(), w.numel(), stream_);
    xin = p.x16.raw();
    win = p.w16.raw();
    yout = p.y16.raw();
  }
  DPT_CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, p.x.d, xin, p.w.d, win, p.fwd.d, p.fwd_algo,
                                          Workspace(), p.fwd_ws, &zero, p.y.d, yout));
  if (p.half) kernels::HalfToF32(p.kind, p.y16.raw(), y->data<float>(), y->numel(), false, stream_);
  if (d.bias) {
    CheckF32(*b, "conv2d b");
    CheckNumel(*b, d.k, "conv2d b", d.ToString());
    DPT_CUDNN_CHECK(cudnnAddTensor(cudnn_, &one, p.b32.d, b->raw(), &one, p.y32.d, y->raw()));
  }
}

void CudaBackend::Conv2dBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                     Tensor* dx) {
  OpScope scope(this, "conv2d_bwd_data");
  const auto& p = static_cast<const ConvPlan&>(plan);
  const Conv2dDesc& d = p.d;
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
    kernels::F32ToHalf(p.kind, dy.data<float>(), p.y16.raw(), dy.numel(), stream_);
    kernels::F32ToHalf(p.kind, w.data<float>(), p.w16.raw(), w.numel(), stream_);
    dyin = p.y16.raw();
    win = p.w16.raw();
    dxout = p.x16.raw();
  }
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, p.w.d, win, p.y.d, dyin, p.bwd_data.d,
                                               p.data_algo, Workspace(), p.data_ws, &zero, p.x.d,
                                               dxout));
  if (p.half)
    kernels::HalfToF32(p.kind, p.x16.raw(), dx->data<float>(), dx->numel(), false, stream_);
}

void CudaBackend::Conv2dBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                        Tensor* dw, Tensor* db, bool accumulate) {
  OpScope scope(this, "conv2d_bwd_weights");
  const auto& p = static_cast<const ConvPlan&>(plan);
  const Conv2dDesc& d = p.d;
  CheckF32(x, "conv2d x");
  CheckF32(dy, "conv2d dy");
  CheckF32(*dw, "conv2d dw");
  CheckNumel(x, d.n * d.c * d.h * d.w, "conv2d x", d.ToString());
  CheckNumel(dy, d.n * d.k * d.out_h() * d.out_w(), "conv2d dy", d.ToString());
  CheckNumel(*dw, d.k * d.c * d.r * d.s, "conv2d dw", d.ToString());
  const float one = 1.f, zero = 0.f;
  const void* xin = x.raw();
  const void* dyin = dy.raw();
  void* dwout = dw->raw();
  // beta = 1 adds into the existing gradient (accumulation); 16-bit results are added when
  // widened instead, so cuDNN never reads the 16-bit staging buffer.
  const float* beta = accumulate && !p.half ? &one : &zero;
  if (p.half) {
    kernels::F32ToHalf(p.kind, x.data<float>(), p.x16.raw(), x.numel(), stream_);
    kernels::F32ToHalf(p.kind, dy.data<float>(), p.y16.raw(), dy.numel(), stream_);
    xin = p.x16.raw();
    dyin = p.y16.raw();
    dwout = p.w16.raw();
  }
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, p.x.d, xin, p.y.d, dyin,
                                                 p.bwd_filter.d, p.filter_algo, Workspace(),
                                                 p.filter_ws, beta, p.w.d, dwout));
  if (p.half) {
    kernels::HalfToF32(p.kind, p.w16.raw(), dw->data<float>(), dw->numel(), accumulate, stream_);
  }
  if (d.bias) {
    DPT_CHECK(db != nullptr) << "conv2d with bias needs a bias gradient";
    CheckF32(*db, "conv2d db");
    CheckNumel(*db, d.k, "conv2d db", d.ToString());
    DPT_CUDNN_CHECK(cudnnConvolutionBackwardBias(cudnn_, &one, p.y32.d, dy.raw(),
                                                 accumulate ? &one : &zero, p.b32.d, db->raw()));
  }
}

// ---- linear: row-major PyTorch layouts on column-major cuBLAS -----------------------------------
// A row-major (r x c) matrix is the column-major (c x r) matrix, its transpose, with ld = c. So
//   y = x W^T    (n x out)  is  y^T = W x^T : gemm(T, N, m=out, n=n, k=in, A=W lda=in, B=x ldb=in)
//   dx = dy W    (n x in)   is  dx^T = W^T dy^T : gemm(N, N, m=in, n=n, k=out, A=W, B=dy ldb=out)
//   dW = dy^T x  (out x in) is  dW^T = x^T dy : gemm(N, T, m=in, n=out, k=n, A=x, B=dy ldb=out)

namespace {
void Gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
          int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c,
          int64_t ldc, cudaDataType_t ab) {
  const float alpha = 1.f;
  DPT_CUBLAS_CHECK(cublasGemmEx(h, ta, tb, static_cast<int>(m), static_cast<int>(n),
                                static_cast<int>(k), &alpha, a, ab, static_cast<int>(lda), b, ab,
                                static_cast<int>(ldb), &beta, c, CUDA_R_32F, static_cast<int>(ldc),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

std::shared_ptr<OpPlan> CudaBackend::PrepareLinear(const LinearDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cuda: linear " << d.ToString();
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot =
      linear_plans_[std::make_tuple(d.n, d.in, d.out, d.bias, static_cast<int>(d.precision))];
  if (slot) return slot;
  auto p = std::make_shared<LinearPlan>();
  p->d = d;
  p->half = IsHalf(d.precision);
  p->kind = HalfKind(d.precision);
  p->ab = !p->half ? CUDA_R_32F : d.precision == Precision::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  if (p->half) {
    const DType ht = HalfDType(d.precision);
    p->x16 = Empty(Shape{d.n * d.in}, ht, "linear 16-bit x");
    p->w16 = Empty(Shape{d.out * d.in}, ht, "linear 16-bit w");
    p->dy16 = Empty(Shape{d.n * d.out}, ht, "linear 16-bit dy");
  }
  slot = p;
  return p;
}

void CudaBackend::LinearForward(const OpPlan& plan, const Tensor& x, const Tensor& w,
                                const Tensor* b, Tensor* y) {
  OpScope scope(this, "linear_fwd");
  const auto& p = static_cast<const LinearPlan&>(plan);
  const LinearDesc& d = p.d;
  CheckF32(x, "linear x");
  CheckF32(w, "linear w");
  CheckF32(*y, "linear y");
  CheckNumel(x, d.n * d.in, "linear x", d.ToString());
  CheckNumel(w, d.out * d.in, "linear w", d.ToString());
  CheckNumel(*y, d.n * d.out, "linear y", d.ToString());
  DPT_CHECK(!d.bias || b != nullptr) << "linear with bias needs a bias tensor";
  const void* xa = x.raw();
  const void* wa = w.raw();
  if (p.half) {
    kernels::F32ToHalf(p.kind, x.data<float>(), p.x16.raw(), x.numel(), stream_);
    kernels::F32ToHalf(p.kind, w.data<float>(), p.w16.raw(), w.numel(), stream_);
    xa = p.x16.raw();
    wa = p.w16.raw();
  }
  Gemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, d.out, d.n, d.in, wa, d.in, xa, d.in, 0.f,
       y->data<float>(), d.out, p.ab);
  if (d.bias) {
    CheckF32(*b, "linear b");
    CheckNumel(*b, d.out, "linear b", d.ToString());
    kernels::AddBiasRows(y->data<float>(), b->data<float>(), d.n, d.out, stream_);
  }
}

void CudaBackend::LinearBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                     Tensor* dx) {
  OpScope scope(this, "linear_bwd_data");
  const auto& p = static_cast<const LinearPlan&>(plan);
  const LinearDesc& d = p.d;
  CheckF32(dy, "linear dy");
  CheckF32(w, "linear w");
  CheckF32(*dx, "linear dx");
  CheckNumel(dy, d.n * d.out, "linear dy", d.ToString());
  CheckNumel(w, d.out * d.in, "linear w", d.ToString());
  CheckNumel(*dx, d.n * d.in, "linear dx", d.ToString());
  const void* dya = dy.raw();
  const void* wa = w.raw();
  if (p.half) {
    kernels::F32ToHalf(p.kind, dy.data<float>(), p.dy16.raw(), dy.numel(), stream_);
    kernels::F32ToHalf(p.kind, w.data<float>(), p.w16.raw(), w.numel(), stream_);
    dya = p.dy16.raw();
    wa = p.w16.raw();
  }
  Gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, d.in, d.n, d.out, wa, d.in, dya, d.out, 0.f,
       dx->data<float>(), d.in, p.ab);
}

void CudaBackend::LinearBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                        Tensor* dw, Tensor* db, bool accumulate) {
  OpScope scope(this, "linear_bwd_weights");
  const auto& p = static_cast<const LinearPlan&>(plan);
  const LinearDesc& d = p.d;
  CheckF32(x, "linear x");
  CheckF32(dy, "linear dy");
  CheckF32(*dw, "linear dw");
  CheckNumel(x, d.n * d.in, "linear x", d.ToString());
  CheckNumel(dy, d.n * d.out, "linear dy", d.ToString());
  CheckNumel(*dw, d.out * d.in, "linear dw", d.ToString());
  const void* xa = x.raw();
  const void* dya = dy.raw();
  if (p.half) {
    kernels::F32ToHalf(p.kind, x.data<float>(), p.x16.raw(), x.numel(), stream_);
    kernels::F32ToHalf(p.kind, dy.data<float>(), p.dy16.raw(), dy.numel(), stream_);
    xa = p.x16.raw();
    dya = p.dy16.raw();
  }
  // beta = 1 accumulates into the f32 gradient (cuBLAS does not read C when beta = 0).
  Gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, d.in, d.out, d.n, xa, d.in, dya, d.out,
       accumulate ? 1.f : 0.f, dw->data<float>(), d.in, p.ab);
  if (d.bias) {
    DPT_CHECK(db != nullptr) << "linear with bias needs a bias gradient";
    CheckF32(*db, "linear db");
    CheckNumel(*db, d.out, "linear db", d.ToString());
    kernels::ColumnSums(dy.data<float>(), d.n, d.out, db->data<float>(), accumulate, stream_);
  }
}

// ---- pooling: own kernels; max pooling records argmax positions in the workspace ----------------

std::shared_ptr<OpPlan> CudaBackend::PreparePool(const PoolDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cuda: pool " << d.ToString();
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = pool_plans_[std::make_tuple(static_cast<int>(d.kind), d.n, d.c, d.h, d.w, d.kernel,
                                           d.stride, d.pad)];
  if (slot) return slot;
  auto p = std::make_shared<PoolPlan>();
  p->d = d;
  p->g = kernels::PoolGeom{d.n * d.c, d.h, d.w, d.out_h(), d.out_w(), d.kernel, d.stride, d.pad};
  p->workspace_bytes =
      d.kind == PoolKind::kMax ? static_cast<size_t>(d.n * d.c * d.out_h() * d.out_w()) * 4 : 0;
  slot = p;
  return p;
}

void CudaBackend::PoolForward(const OpPlan& plan, const Tensor& x, Tensor* y, Tensor* ws) {
  OpScope scope(this, "pool_fwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  CheckF32(x, "pool x");
  CheckF32(*y, "pool y");
  CheckNumel(x, p.d.n * p.d.c * p.d.h * p.d.w, "pool x", p.d.ToString());
  CheckNumel(*y, p.d.n * p.d.c * p.d.out_h() * p.d.out_w(), "pool y", p.d.ToString());
  if (p.d.kind == PoolKind::kAvg) {
    kernels::AvgPoolForward(p.g, x.data<float>(), y->data<float>(), stream_);
    return;
  }
  int32_t* argmax = nullptr;
  if (ws != nullptr) {
    CheckDev(*ws, "pool workspace");
    DPT_CHECK(ws->bytes() >= p.workspace_bytes) << "pool workspace too small";
    argmax = ws->data<int32_t>();
  }
  kernels::MaxPoolForward(p.g, x.data<float>(), y->data<float>(), argmax, stream_);
}

void CudaBackend::PoolBackward(const OpPlan& plan, const Tensor& dy, const Tensor* ws, Tensor* dx) {
  OpScope scope(this, "pool_bwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  CheckF32(dy, "pool dy");
  CheckF32(*dx, "pool dx");
  CheckNumel(dy, p.d.n * p.d.c * p.d.out_h() * p.d.out_w(), "pool dy", p.d.ToString());
  CheckNumel(*dx, p.d.n * p.d.c * p.d.h * p.d.w, "pool dx", p.d.ToString());
  if (p.d.kind == PoolKind::kAvg) {
    kernels::AvgPoolBackward(p.g, dy.data<float>(), dx->data<float>(), stream_);
    return;
  }
  DPT_CHECK(ws != nullptr) << "max-pool backward needs the forward workspace";
  CheckDev(*ws, "pool workspace");
  DPT_CHECK(ws->bytes() >= p.workspace_bytes) << "pool workspace too small";
  kernels::MaxPoolBackward(p.g, dy.data<float>(), ws->data<int32_t>(), dx->data<float>(), stream_);
}

// ---- elementwise --------------------------------------------------------------------------------

void CudaBackend::ReluForward(const Tensor& x, Tensor* y) {
  OpScope scope(this, "relu_fwd");
  CheckF32(x, "relu x");
  CheckF32(*y, "relu y");
  CheckSame(x, *y, "relu");
  kernels::Relu(x.data<float>(), y->data<float>(), x.numel(), stream_);
}

void CudaBackend::ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) {
  OpScope scope(this, "relu_bwd");
  CheckF32(y, "relu y");
  CheckF32(dy, "relu dy");
  CheckF32(*dx, "relu dx");
  CheckSame(y, dy, "relu backward");
  CheckSame(y, *dx, "relu backward");
  kernels::ReluBackward(y.data<float>(), dy.data<float>(), dx->data<float>(), y.numel(), stream_);
}

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor* y) {
  OpScope scope(this, "add");
  CheckF32(a, "add a");
  CheckF32(b, "add b");
  CheckF32(*y, "add y");
  CheckSame(a, b, "add");
  CheckSame(a, *y, "add");
  kernels::Add(a.data<float>(), b.data<float>(), y->data<float>(), a.numel(), stream_);
}

void CudaBackend::Scale(Tensor* t, float alpha) {
  OpScope scope(this, "scale");
  CheckF32(*t, "scale");
  kernels::Scale(t->data<float>(), t->numel(), alpha, stream_);
}

void CudaBackend::DropoutForward(const Tensor& x, float p, uint64_t seed, Tensor* y) {
  OpScope scope(this, "dropout");
  CheckF32(x, "dropout x");
  CheckF32(*y, "dropout y");
  CheckSame(x, *y, "dropout");
  kernels::Dropout(x.data<float>(), y->data<float>(), x.numel(), p, seed, stream_);
}

void CudaBackend::DropoutBackward(const Tensor& dy, float p, uint64_t seed, Tensor* dx) {
  DropoutForward(dy, p, seed, dx);  // the same mask and scale
}

// ---- batch norm ---------------------------------------------------------------------------------

namespace {
void CheckChannels(const Tensor& t, int64_t c, const char* what) {
  CheckF32(t, what);
  DPT_CHECK(t.numel() == c) << what << " " << t.shape().ToString() << " for " << c << " channels";
}
}  // namespace

void CudaBackend::BatchNormForwardTraining(const BatchNormArgs& a, const Tensor& x,
                                           const Tensor& gamma, const Tensor& beta,
                                           Tensor* running_mean, Tensor* running_var, Tensor* y,
                                           Tensor* save_mean, Tensor* save_invstd) {
  OpScope scope(this, "batchnorm_fwd");
  CheckF32(x, "batch norm x");
  CheckF32(*y, "batch norm y");
  CheckSame(x, *y, "batch norm");
  const BatchNormDims d = BatchNormShape(x.shape());
  for (const Tensor* t :
       {&gamma, &beta, static_cast<const Tensor*>(running_mean),
        static_cast<const Tensor*>(running_var), static_cast<const Tensor*>(save_mean),
        static_cast<const Tensor*>(save_invstd)}) {
    CheckChannels(*t, d.c, "batch norm per-channel tensor");
  }
  kernels::BatchNormTraining(d.n, d.c, d.hw, a.momentum, a.eps, x.data<float>(),
                             gamma.data<float>(), beta.data<float>(), running_mean->data<float>(),
                             running_var->data<float>(), y->data<float>(), save_mean->data<float>(),
                             save_invstd->data<float>(), stream_);
}

void CudaBackend::BatchNormForwardInference(const BatchNormArgs& a, const Tensor& x,
                                            const Tensor& gamma, const Tensor& beta,
                                            const Tensor& running_mean, const Tensor& running_var,
                                            Tensor* y) {
  OpScope scope(this, "batchnorm_infer");
  CheckF32(x, "batch norm x");
  CheckF32(*y, "batch norm y");
  CheckSame(x, *y, "batch norm");
  const BatchNormDims d = BatchNormShape(x.shape());
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var}) {
    CheckChannels(*t, d.c, "batch norm per-channel tensor");
  }
  kernels::BatchNormInference(d.n, d.c, d.hw, a.eps, x.data<float>(), gamma.data<float>(),
                              beta.data<float>(), running_mean.data<float>(),
                              running_var.data<float>(), y->data<float>(), stream_);
}

void CudaBackend::BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                    const Tensor& save_mean, const Tensor& save_invstd, Tensor* dx,
                                    Tensor* dgamma, Tensor* dbeta, bool accumulate) {
  OpScope scope(this, "batchnorm_bwd");
  CheckF32(x, "batch norm x");
  CheckF32(dy, "batch norm dy");
  CheckF32(*dx, "batch norm dx");
  CheckSame(x, dy, "batch norm backward");
  CheckSame(x, *dx, "batch norm backward");
  const BatchNormDims d = BatchNormShape(x.shape());
  for (const Tensor* t : {&gamma, &save_mean, &save_invstd, static_cast<const Tensor*>(dgamma),
                          static_cast<const Tensor*>(dbeta)}) {
    CheckChannels(*t, d.c, "batch norm per-channel tensor");
  }
  kernels::BatchNormBackward(d.n, d.c, d.hw, x.data<float>(), dy.data<float>(), gamma.data<float>(),
                             save_mean.data<float>(), save_invstd.data<float>(), dx->data<float>(),
                             dgamma->data<float>(), dbeta->data<float>(), accumulate, stream_);
}

// ---- losses -------------------------------------------------------------------------------------

void CudaBackend::SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels, Tensor* probs,
                                      Tensor* loss_sum, Tensor* correct) {
  OpScope scope(this, "softmax_xent");
  CheckF32(logits, "softmax logits");
  DPT_CHECK(logits.shape().rank() == 2) << "logits " << logits.shape().ToString();
  const int64_t n = logits.shape()[0], k = logits.shape()[1];
  CheckDev(labels, "softmax labels");
  DPT_CHECK(labels.numel() == n && labels.dtype() == DType::kI32) << "labels for " << n;
  DPT_CHECK(n < INT_MAX) << "batch of " << n << " rows";
  CheckF32(*probs, "softmax probs");
  CheckSame(logits, *probs, "softmax probs");
  CheckF32(*loss_sum, "softmax loss_sum");
  if (correct != nullptr) CheckF32(*correct, "softmax correct");
  // Per-row results, summed in a fixed order by a second kernel (deterministic). Temporaries
  // come from the caching allocator; stream order makes their reuse safe.
  Tensor row_loss = Empty(Shape{std::max<int64_t>(n, 1) * 8}, DType::kU8, "softmax row losses");
  Tensor row_hit = Empty(Shape{std::max<int64_t>(n, 1) * 4}, DType::kU8, "softmax row hits");
  auto* bad_row = ScalarSlot<int32_t>(scalars_, kBadRowSlot);
  constexpr int32_t kNoBadRow = 0x7f7f7f7f;  // the memset pattern below
  DPT_CUDA_CHECK(cudaMemsetAsync(bad_row, 0x7f, sizeof(int32_t), stream_));
  kernels::SoftmaxXent(n, k, logits.data<float>(), labels.data<int32_t>(), probs->data<float>(),
                       row_loss.data<double>(), row_hit.data<int32_t>(), bad_row, stream_);
  kernels::SumRows(n, row_loss.data<double>(), row_hit.data<int32_t>(), loss_sum->data<float>(),
                   correct != nullptr ? correct->data<float>() : nullptr, stream_);
  // A label outside [0, k) is a data error, as on the CPU; finding out costs one synchronisation
  // (the caller reads the loss right after anyway).
  int32_t bad = kNoBadRow;
  DPT_CUDA_CHECK(cudaMemcpyAsync(&bad, bad_row, sizeof bad, cudaMemcpyDeviceToHost, stream_));
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (bad != kNoBadRow) {
    int32_t label = 0;
    DPT_CUDA_CHECK(cudaMemcpyAsync(&label, labels.data<int32_t>() + bad, sizeof label,
                                   cudaMemcpyDeviceToHost, stream_));
    DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    DPT_THROW(DataError) << "label " << label << " of sample " << bad
                         << " in the batch is outside [0, " << k << ")";
  }
}

void CudaBackend::SoftmaxCrossEntropyBackward(const Tensor& probs, const Tensor& labels,
                                              float scale, Tensor* dlogits) {
  OpScope scope(this, "softmax_xent_bwd");
  CheckF32(probs, "softmax probs");
  DPT_CHECK(probs.shape().rank() == 2) << "probs " << probs.shape().ToString();
  const int64_t n = probs.shape()[0], k = probs.shape()[1];
  CheckDev(labels, "softmax labels");
  DPT_CHECK(labels.numel() == n && labels.dtype() == DType::kI32) << "labels for " << n;
  CheckF32(*dlogits, "softmax dlogits");
  CheckSame(probs, *dlogits, "softmax backward");
  kernels::SoftmaxXentBackward(n, k, probs.data<float>(), labels.data<int32_t>(), scale,
                               dlogits->data<float>(), stream_);
}

void CudaBackend::MseLoss(const Tensor& y, const Tensor& t, Tensor* loss_sum) {
  OpScope scope(this, "mse");
  CheckF32(y, "mse y");
  CheckF32(t, "mse t");
  CheckF32(*loss_sum, "mse loss_sum");
  CheckSame(y, t, "mse");
  kernels::SquaredErrorSum(y.data<float>(), t.data<float>(), y.numel(), partials_.data<double>(),
                           loss_sum->data<float>(), stream_);
}

void CudaBackend::MseBackward(const Tensor& y, const Tensor& t, float scale, Tensor* dy) {
  OpScope scope(this, "mse_bwd");
  CheckF32(y, "mse y");
  CheckF32(t, "mse t");
  CheckF32(*dy, "mse dy");
  CheckSame(y, t, "mse backward");
  CheckSame(y, *dy, "mse backward");
  kernels::MseBackward(y.data<float>(), t.data<float>(), scale, dy->data<float>(), y.numel(),
                       stream_);
}

// ---- optimizers ---------------------------------------------------------------------------------

void CudaBackend::SgdStep(const ew::SgdHyper& h, Tensor* param, const Tensor& grad,
                          Tensor* momentum) {
  OpScope scope(this, "sgd");
  CheckF32(*param, "sgd param");
  CheckF32(grad, "sgd grad");
  CheckSame(*param, grad, "sgd");
  float* buf = nullptr;
  if (momentum != nullptr && momentum->defined()) {
    CheckF32(*momentum, "sgd momentum");
    CheckSame(*param, *momentum, "sgd momentum");
    buf = momentum->data<float>();
  }
  DPT_CHECK(buf != nullptr || h.momentum == 0.f) << "sgd with momentum needs a momentum buffer";
  kernels::SgdStep(h, param->data<float>(), grad.data<float>(), buf, param->numel(), stream_);
}

void CudaBackend::AdamWStep(const ew::AdamWHyper& h, Tensor* param, const Tensor& grad, Tensor* m,
                            Tensor* v) {
  OpScope scope(this, "adamw");
  CheckF32(*param, "adamw param");
  CheckF32(grad, "adamw grad");
  CheckF32(*m, "adamw m");
  CheckF32(*v, "adamw v");
  CheckSame(*param, grad, "adamw");
  CheckSame(*param, *m, "adamw m");
  CheckSame(*param, *v, "adamw v");
  kernels::AdamWStep(h, param->data<float>(), grad.data<float>(), m->data<float>(),
                     v->data<float>(), param->numel(), stream_);
}

// ---- checks (synchronise) -----------------------------------------------------------------------

int64_t CudaBackend::CountNonFinite(const Tensor& t) {
  MakeCurrent();
  CheckF32(t, "CountNonFinite");
  auto* out = ScalarSlot<unsigned long long>(scalars_, kCountSlot);
  kernels::CountNonFinite(t.data<float>(), t.numel(), partials_.data<unsigned long long>(), out,
                          stream_);
  unsigned long long host = 0;
  DPT_CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof host, cudaMemcpyDeviceToHost, stream_));
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return static_cast<int64_t>(host);
}

double CudaBackend::SumSquares(const Tensor& t) {
  MakeCurrent();
  CheckF32(t, "SumSquares");
  auto* out = ScalarSlot<double>(scalars_, kSumSlot);
  kernels::SumSquares(t.data<float>(), t.numel(), partials_.data<double>(), out, stream_);
  double host = 0;
  DPT_CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof host, cudaMemcpyDeviceToHost, stream_));
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host;
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

DeviceIdentity IdentityOf(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  DPT_CHECK(cuda != nullptr) << "IdentityOf: backend '" << backend.name() << "' is not cuda";
  return cuda->identity();
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
  if (cublasGetProperty(MAJOR_VERSION, &bmaj) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &bmin) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &bpat) == CUBLAS_STATUS_SUCCESS) {
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
