// SPDX-License-Identifier: Apache-2.0
// CPU backend. Convolution, inner product (linear) and pooling are oneDNN primitives whose
// primitive descriptors are built once per descriptor and cached (plan once, run many). oneDNN's
// scratchpad is user-managed so execution allocates nothing. Everything elementwise goes through
// core/elementwise.h, the same functions the CUDA kernels call.
//
// This file: the backend object (construction, host memory, plan release, threads), copies, the
// Supports() rules and the oneDNN version. The ops live in one file per family: cpu_conv.cc,
// cpu_linear.cc, cpu_pool.cc (oneDNN, over the staging in cpu_onednn.cc), cpu_elementwise.cc
// (elementwise, optimizer updates, checks) and cpu_norm_loss.cc (batch norm, losses).
#include "core/cpu/cpu_backend.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>

#include "core/cpu/cpu_backend_impl.h"
#include "core/error.h"
#include "core/op_dispatch.h"

namespace dptrain::cpu {
namespace {

class HostRawAllocator final : public RawAllocator {
 public:
  void* Alloc(size_t bytes) noexcept override {
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void Free(void* ptr) noexcept override { std::free(ptr); }
  Device device() const override { return Device::kCpu; }
};

}  // namespace

CpuBackend::CpuBackend()
    : Backend(std::make_unique<CachingAllocator>(std::make_unique<HostRawAllocator>())),
      impl_(std::make_unique<Impl>()) {
  impl_->owner = this;
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::Run(const Op& op) { RunOp(*this, op); }
bool CpuBackend::Supports(const PlanDesc& d) const { return SupportsPlanned(*this, d); }
std::shared_ptr<OpPlan> CpuBackend::Prepare(const PlanDesc& d) { return PrepareOp(*this, d); }
void CpuBackend::Run(const OpPlan& plan, const PlannedOp& op) { RunPlannedOp(*this, plan, op); }

size_t CpuBackend::SharedWorkspaceBytes() const {
  return (impl_->scratchpad.defined() ? impl_->scratchpad.bytes() : 0) +
         (impl_->transient.defined() ? impl_->transient.bytes() : 0);
}

void CpuBackend::ReleasePlans() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->conv.clear();
  impl_->linear.clear();
  impl_->pool.clear();
  impl_->scratchpad = Tensor();
  impl_->transient = Tensor();
}

void CpuBackend::ApplyOptions(const BackendOptions& next) {
  if (next.threads > 0) omp_set_num_threads(next.threads);
  bool release = false;
  if (next.cpu_fusions != fusions_) {
    fusions_ = next.cpu_fusions;
    release = true;
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->winograd != next.winograd) {
      impl_->winograd = next.winograd;
      impl_->winograd_planned = false;
      release = true;
    }
  }
  if (release) ReleasePlans();
}

// ---- memory ------------------------------------------------------------------------------

void CpuBackend::CopyFromHost(const void* src, Tensor* dst) {
  OpScope scope(this, "copy_h2d");
  std::memcpy(dst->raw(), src, dst->bytes());
}
void CpuBackend::CopyToHost(const Tensor& src, void* dst) {
  OpScope scope(this, "copy_d2h");
  std::memcpy(dst, src.raw(), src.bytes());
}
void CpuBackend::Copy(const Tensor& src, Tensor* dst) {
  OpScope scope(this, "copy");
  DPT_CHECK(src.bytes() == dst->bytes()) << src.bytes() << " vs " << dst->bytes();
  if (src.raw() != dst->raw()) std::memmove(dst->raw(), src.raw(), src.bytes());
}
void CpuBackend::CopyColumns(const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col,
                             int64_t cols) {
  OpScope scope(this, "copy_columns");
  const ColumnCopy c = CheckColumnCopy(src, src_col, *dst, dst_col, cols);
  const float* s = src.data<float>() + src_col;
  float* d = dst->data<float>() + dst_col;
  const auto bytes = static_cast<size_t>(cols) * sizeof(float);
#pragma omp parallel for if (c.rows * cols > (1 << 16))
  for (int64_t r = 0; r < c.rows; ++r) std::memcpy(d + r * c.dst_pitch, s + r * c.src_pitch, bytes);
}
void CpuBackend::Zero(Tensor* t) { std::memset(t->raw(), 0, t->bytes()); }
void CpuBackend::Fill(Tensor* t, float value) {
  CheckF32(*t, "Fill");
  float* p = t->data<float>();
  const int64_t n = t->numel();
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

// ---- support -----------------------------------------------------------------------------

// fp32 runs natively, fp16 is emulated (operands and results rounded to fp16, see Staged), bf16
// needs oneDNN's bf16 kernels.
// Without cpu_fusions (planning for the CUDA backend), the bf16 hand-offs that backend takes: no
// bf16 y or dy with a bias (CudaBackend::Supports).
bool CpuBackend::Supports(const Conv2dDesc& d) const {
  const bool handoff = d.dy_bf16 || d.x_bf16 || d.y_bf16;
  const bool as_cuda = !((d.y_bf16 || d.dy_bf16) && d.bias);
  return d.Valid() && PrecisionOk(d.precision) &&
         (!handoff || (d.precision == Precision::kBF16 && (fusions_ || as_cuda))) &&
         (!d.y_bf16 || (!d.relu && d.y_nhwc)) && (!d.dx_sub || PlansSubsample(d));
}
bool CpuBackend::Supports(const LinearDesc& d) const {
  return d.n > 0 && d.in > 0 && d.out > 0 && PrecisionOk(d.precision);
}
bool CpuBackend::Supports(const PoolDesc& d) const {
  // dx in bf16 with a channels-last window over 16 x 16 would run on oneDNN 2.6's bf16 backward,
  // which put gradients where the f32 one does not (PoolTest, a 17 x 17 window): refused.
  // y in NCHW from channels-last x (y_nchw): the own max pooling only.
  // The CUDA backend runs both too: they do not depend on cpu_fusions.
  return d.Valid() &&
         (!d.dx_bf16 ||
          (d.kind == PoolKind::kMax && d.stride >= d.kernel &&
           (!d.nhwc || d.kernel <= kOwnMaxPoolKernel) && PrecisionOk(Precision::kBF16))) &&
         (!d.y_nchw || (d.nhwc && d.kind == PoolKind::kMax && d.kernel <= kOwnMaxPoolKernel));
}

std::string OneDnnVersion() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

}  // namespace dptrain::cpu
