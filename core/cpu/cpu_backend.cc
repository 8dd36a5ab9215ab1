// SPDX-License-Identifier: Apache-2.0
// CPU backend. Convolution, inner product (linear) and pooling are oneDNN primitives whose
// primitive descriptors are built once per descriptor and cached (plan once, run many). oneDNN's
// scratchpad is user-managed so execution allocates nothing. Everything elementwise goes through
// core/elementwise.h, the same functions the CUDA kernels call.
#include "core/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <tuple>

#include "core/elementwise.h"
#include "core/error.h"

namespace dptrain::cpu {
namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

// oneDNN reports failures with dnnl::error; rethrow at the backend edge as DnnlError.
#define DPT_DNNL(expr)                                                    \
  [&]() {                                                                 \
    try {                                                                 \
      return expr;                                                        \
    } catch (const dnnl::error& e) {                                      \
      DPT_THROW(::dptrain::DnnlError)                                     \
          << #expr << ": " << e.what() << " (status " << e.status << ")"; \
    }                                                                     \
  }()

constexpr int64_t kParallelMin = 1 << 14;  // below this an OpenMP region costs more than it saves

class HostRawAllocator final : public RawAllocator {
 public:
  void* Alloc(size_t bytes) noexcept override {
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void Free(void* ptr) noexcept override { std::free(ptr); }
  Device device() const override { return Device::kCpu; }
};

void CheckF32(const Tensor& t, const char* what) {
  DPT_CHECK(t.defined() && t.dtype() == DType::kF32 && t.device() == Device::kCpu)
      << what << ": expected a cpu f32 tensor";
}
void CheckSame(const Tensor& a, const Tensor& b, const char* what) {
  DPT_CHECK(a.numel() == b.numel())
      << what << ": " << a.shape().ToString() << " vs " << b.shape().ToString();
}

dnnl::primitive_attr MakeAttr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Rounds n floats to the nearest fp16 values (ew::RoundToHalf), from x into y (may alias).
void RoundToHalf(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = ew::RoundToHalf(x[i]);
}

// A tensor in the caller's layout (f32, NCHW / OIHW / NC) seen by a primitive that wants its own
// layout (blocked formats such as nChw16c, and bf16 for bf16 precision): the primitive's memory
// is either the caller's tensor itself (same descriptor) or a staging buffer filled / drained by
// a reorder. Staging buffers belong to the plan; plans run one call at a time.
//
// fp16 precision (oneDNN has no fp16 kernels for this CPU) is computed as the CUDA backend's
// fp16 mode computes it: operands rounded to fp16, products accumulated in f32, results rounded
// to fp16 (a gradient beyond 65504 becomes infinity, which fp16 loss scaling detects). `half`
// marks such a tensor: inputs are rounded into `rounded` first, outputs are rounded in place.
struct Staged {
  memory::desc user, inner;
  bool same = true;
  bool half = false;
  Tensor buf, rounded;
  dnnl::reorder to_inner, to_user;

  void Init(CpuBackend& be, const dnnl::engine& eng, const memory::desc& user_md,
            const memory::desc& inner_md, const std::string& label, bool round_half = false,
            bool is_input = false) {
    user = user_md;
    inner = inner_md;
    same = user_md == inner_md;
    half = round_half;
    if (half && is_input) {
      rounded = be.Empty(Shape{static_cast<int64_t>(user_md.get_size() / sizeof(float))},
                         DType::kF32, label + " (fp16 values)");
    }
    if (same) return;
    buf = be.Empty(Shape{static_cast<int64_t>(inner_md.get_size())}, DType::kU8, label);
    to_inner = dnnl::reorder(memory(user_md, eng, nullptr), memory(inner_md, eng, nullptr));
    to_user = dnnl::reorder(memory(inner_md, eng, nullptr), memory(user_md, eng, nullptr));
  }
  // The primitive's input memory holding t's values (rounded to fp16 when `half`).
  memory In(const dnnl::engine& eng, dnnl::stream& st, const Tensor& t) const {
    void* src_ptr = t.raw();
    if (half) {
      RoundToHalf(t.data<float>(), rounded.data<float>(), rounded.numel());
      src_ptr = rounded.raw();
    }
    if (same) return memory(user, eng, src_ptr);
    memory src(user, eng, src_ptr);
    memory in(inner, eng, buf.raw());
    to_inner.execute(st, src, in);
    return in;
  }
  // The primitive's output memory for t; call Out() after the primitive ran.
  memory OutMem(const dnnl::engine& eng, const Tensor& t) const {
    return same ? memory(user, eng, t.raw()) : memory(inner, eng, buf.raw());
  }
  void Out(const dnnl::engine& eng, dnnl::stream& st, const Tensor& t) const {
    if (!same) {
      memory src(inner, eng, buf.raw());
      memory dst(user, eng, t.raw());
      to_user.execute(st, src, dst);
    }
    if (half) RoundToHalf(t.data<float>(), t.data<float>(), t.numel());
  }
};

size_t HeldBytes(std::initializer_list<const Staged*> staged,
                 std::initializer_list<const Tensor*> tensors) {
  size_t n = 0;
  for (const Staged* st : staged) {
    n += st->buf.defined() ? st->buf.bytes() : 0;
    n += st->rounded.defined() ? st->rounded.bytes() : 0;
  }
  for (const Tensor* t : tensors) n += t->defined() ? t->bytes() : 0;
  return n;
}

Dt ComputeType(Precision p) { return p == Precision::kBF16 ? Dt::bf16 : Dt::f32; }

// Conv2d and linear run the same three primitives on the same staged operands: forward
// (x, w -> y), backward data (dy, w -> dx) and backward weights (x, dy -> dw and db).
struct WeightedPlan : OpPlan {
  bool bias = false;
  memory::desc b_md, fwd_scratch, data_scratch, weights_scratch;
  dnnl::primitive fwd, bwd_data, bwd_w;
  // forward: x, w in; y out. backward data: dy, w in; dx out. backward weights: x, dy in; dw out.
  Staged f_x, f_w, f_y, d_dy, d_w, d_dx, w_x, w_dy, w_dw;
  Tensor acc_w, acc_b;  // accumulate = true computes here first, then adds
};

struct ConvPlan final : WeightedPlan {
  Conv2dDesc d;
};

struct LinearPlan final : WeightedPlan {
  LinearDesc d;
};

struct PoolPlan final : OpPlan {
  PoolDesc d;
  memory::desc x_md, y_md;
  dnnl::pooling_forward::primitive_desc train_pd, infer_pd;
  dnnl::pooling_backward::primitive_desc bwd_pd;
  dnnl::pooling_forward train, infer;
  dnnl::pooling_backward bwd;
};

auto ConvKey(const Conv2dDesc& d) {
  return std::make_tuple(d.n, d.c, d.h, d.w, d.k, d.r, d.s, d.stride, d.pad, d.bias,
                         static_cast<int>(d.precision));
}
auto LinearKey(const LinearDesc& d) {
  return std::make_tuple(d.n, d.in, d.out, d.bias, static_cast<int>(d.precision));
}
auto PoolKey(const PoolDesc& d) {
  return std::make_tuple(static_cast<int>(d.kind), d.n, d.c, d.h, d.w, d.kernel, d.stride, d.pad);
}

// y[i] += x[i]
void AddInto(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace

struct CpuBackend::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mu;  // guards the caches (Prepare may be called from several threads in tests)
  std::map<decltype(ConvKey({})), std::shared_ptr<ConvPlan>> conv;
  std::map<decltype(LinearKey({})), std::shared_ptr<LinearPlan>> linear;
  std::map<decltype(PoolKey({})), std::shared_ptr<PoolPlan>> pool;
  // One scratchpad shared by all primitives (they run one at a time on one stream).
  Tensor scratchpad;

  void Reserve(CpuBackend& be, const memory::desc& md) {
    const size_t need = md.get_size();
    if (!scratchpad.defined() || scratchpad.bytes() < need) {
      scratchpad = be.Empty(Shape{static_cast<int64_t>(std::max<size_t>(need, 1))}, DType::kU8,
                            "onednn scratchpad");
    }
  }
  memory Mem(const memory::desc& md, const Tensor& t) const { return memory(md, engine, t.raw()); }
  memory Scratch(const memory::desc& md) const {
    return memory(md, engine, scratchpad.defined() ? scratchpad.raw() : nullptr);
  }

  // Completes a conv2d / linear plan from its three primitive descriptors: the primitives, the
  // staging between the caller's f32 layouts (x_user, w_user, y_user) and the primitives' own,
  // the scratchpad, the weight-gradient accumulators. `op` names the buffers ("conv2d").
  template <class FwdPd, class DataPd, class WeightsPd>
  void Finish(CpuBackend& be, WeightedPlan* p, const std::string& op, bool half, const FwdPd& fwd,
              const DataPd& data, const WeightsPd& weights, const memory::desc& x_user,
              const memory::desc& w_user, const memory::desc& y_user, const Shape& w_shape) {
    p->fwd = dnnl::primitive(fwd);
    p->bwd_data = dnnl::primitive(data);
    p->bwd_w = dnnl::primitive(weights);
    p->fwd_scratch = fwd.scratchpad_desc();
    p->data_scratch = data.scratchpad_desc();
    p->weights_scratch = weights.scratchpad_desc();
    const bool in = true;
    p->f_x.Init(be, engine, x_user, fwd.src_desc(), op + " staged input", half, in);
    p->f_w.Init(be, engine, w_user, fwd.weights_desc(), op + " staged weight", half, in);
    p->f_y.Init(be, engine, y_user, fwd.dst_desc(), op + " staged output", half);
    p->d_dy.Init(be, engine, y_user, data.diff_dst_desc(), op + " staged dy", half, in);
    p->d_w.Init(be, engine, w_user, data.weights_desc(), op + " staged weight", half, in);
    p->d_dx.Init(be, engine, x_user, data.diff_src_desc(), op + " staged dx", half);
    p->w_x.Init(be, engine, x_user, weights.src_desc(), op + " staged input", half, in);
    p->w_dy.Init(be, engine, y_user, weights.diff_dst_desc(), op + " staged dy", half, in);
    p->w_dw.Init(be, engine, w_user, weights.diff_weights_desc(), op + " staged dw", half);
    Reserve(be, p->fwd_scratch);
    Reserve(be, p->data_scratch);
    Reserve(be, p->weights_scratch);
    p->acc_w = be.Empty(w_shape, DType::kF32, op + " weight-grad accumulator");
    if (p->bias) p->acc_b = be.Empty(Shape{w_shape[0]}, DType::kF32, op + " bias-grad accumulator");
    p->held_bytes = HeldBytes(
        {&p->f_x, &p->f_w, &p->f_y, &p->d_dy, &p->d_w, &p->d_dx, &p->w_x, &p->w_dy, &p->w_dw},
        {&p->acc_w, &p->acc_b});
  }

  void Forward(const WeightedPlan& p, const Tensor& x, const Tensor& w, const Tensor* b,
               Tensor* y) {
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, p.f_x.In(engine, stream, x)},
                                         {DNNL_ARG_WEIGHTS, p.f_w.In(engine, stream, w)},
                                         {DNNL_ARG_DST, p.f_y.OutMem(engine, *y)},
                                         {DNNL_ARG_SCRATCHPAD, Scratch(p.fwd_scratch)}};
    if (p.bias) args.emplace(DNNL_ARG_BIAS, Mem(p.b_md, *b));
    DPT_DNNL(p.fwd.execute(stream, args));
    p.f_y.Out(engine, stream, *y);
  }

  void BackwardData(const WeightedPlan& p, const Tensor& dy, const Tensor& w, Tensor* dx) {
    DPT_DNNL(p.bwd_data.execute(stream, {{DNNL_ARG_DIFF_DST, p.d_dy.In(engine, stream, dy)},
                                         {DNNL_ARG_WEIGHTS, p.d_w.In(engine, stream, w)},
                                         {DNNL_ARG_DIFF_SRC, p.d_dx.OutMem(engine, *dx)},
                                         {DNNL_ARG_SCRATCHPAD, Scratch(p.data_scratch)}}));
    p.d_dx.Out(engine, stream, *dx);
  }

  void BackwardWeights(const WeightedPlan& p, const Tensor& x, const Tensor& dy, Tensor* dw,
                       Tensor* db, bool accumulate) {
    Tensor w_out = accumulate ? p.acc_w : *dw;
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, p.w_x.In(engine, stream, x)},
                                         {DNNL_ARG_DIFF_DST, p.w_dy.In(engine, stream, dy)},
                                         {DNNL_ARG_DIFF_WEIGHTS, p.w_dw.OutMem(engine, w_out)},
                                         {DNNL_ARG_SCRATCHPAD, Scratch(p.weights_scratch)}};
    if (p.bias) args.emplace(DNNL_ARG_DIFF_BIAS, Mem(p.b_md, accumulate ? p.acc_b : *db));
    DPT_DNNL(p.bwd_w.execute(stream, args));
    p.w_dw.Out(engine, stream, w_out);
    if (accumulate) {
      AddInto(p.acc_w.data<float>(), dw->data<float>(), dw->numel());
      if (p.bias) AddInto(p.acc_b.data<float>(), db->data<float>(), db->numel());
    }
  }
};

CpuBackend::CpuBackend()
    : Backend(std::make_unique<CachingAllocator>(std::make_unique<HostRawAllocator>())),
      impl_(std::make_unique<Impl>()) {}

CpuBackend::~CpuBackend() = default;

size_t CpuBackend::SharedWorkspaceBytes() const {
  return impl_->scratchpad.defined() ? impl_->scratchpad.bytes() : 0;
}

void CpuBackend::ReleasePlans() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->conv.clear();
  impl_->linear.clear();
  impl_->pool.clear();
  impl_->scratchpad = Tensor();
}

void CpuBackend::SetThreads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
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
void CpuBackend::Zero(Tensor* t) { std::memset(t->raw(), 0, t->bytes()); }
void CpuBackend::Fill(Tensor* t, float value) {
  CheckF32(*t, "Fill");
  float* p = t->data<float>();
  const int64_t n = t->numel();
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

// ---- support -----------------------------------------------------------------------------

namespace {
// oneDNN runs bf16 convolutions and inner products only on CPUs with AVX-512 (avx512_core and
// newer); elsewhere creating the primitive fails with "unimplemented". Probe once with the
// smallest shapes instead of guessing from ISA names.
bool OneDnnHasBf16() {
  static const bool ok = [] {
    try {
      const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
      const memory::desc x({1, 1, 1, 1}, Dt::bf16, Tag::any), w({1, 1, 1, 1}, Dt::bf16, Tag::any),
          y({1, 1, 1, 1}, Dt::bf16, Tag::any);
      const auto conv = dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                          dnnl::algorithm::convolution_direct, x, w, y, {1, 1},
                                          {0, 0}, {0, 0}),
          eng);
      const memory::desc xi({1, 1}, Dt::bf16, Tag::any), wi({1, 1}, Dt::bf16, Tag::any),
          yi({1, 1}, Dt::bf16, Tag::any);
      const auto ip = dnnl::inner_product_forward::primitive_desc(
          dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, xi, wi, yi), eng);
      (void)conv;
      (void)ip;
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}
bool PrecisionOk(Precision p) { return p != Precision::kBF16 || OneDnnHasBf16(); }
}  // namespace

// fp32 runs natively, fp16 is emulated (operands and results rounded to fp16, see Staged), bf16
// needs oneDNN's bf16 kernels.
bool CpuBackend::Supports(const Conv2dDesc& d) const {
  return d.n > 0 && d.c > 0 && d.h > 0 && d.w > 0 && d.k > 0 && d.r > 0 && d.s > 0 &&
         d.stride > 0 && d.pad >= 0 && d.out_h() > 0 && d.out_w() > 0 && PrecisionOk(d.precision);
}
bool CpuBackend::Supports(const LinearDesc& d) const {
  return d.n > 0 && d.in > 0 && d.out > 0 && PrecisionOk(d.precision);
}
// oneDNN pooling needs the padding within half the window (as PyTorch does).
bool CpuBackend::Supports(const PoolDesc& d) const {
  return d.n > 0 && d.c > 0 && d.h > 0 && d.w > 0 && d.kernel > 0 && d.stride > 0 && d.pad >= 0 &&
         d.pad * 2 <= d.kernel && d.out_h() > 0 && d.out_w() > 0;
}

// ---- conv2d ------------------------------------------------------------------------------

std::shared_ptr<OpPlan> CpuBackend::PrepareConv2d(const Conv2dDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cpu: conv2d " << d.ToString();
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& slot = impl_->conv[ConvKey(d)];
  if (slot) return slot;
  auto p = std::make_shared<ConvPlan>();
  p->d = d;
  p->bias = d.bias;
  const auto& eng = impl_->engine;
  const memory::dims strides{d.stride, d.stride}, pad{d.pad, d.pad};
  const memory::dims xs{d.n, d.c, d.h, d.w}, ws{d.k, d.c, d.r, d.s},
      ys{d.n, d.k, d.out_h(), d.out_w()};
  const memory::desc x_user(xs, Dt::f32, Tag::nchw), w_user(ws, Dt::f32, Tag::oihw),
      y_user(ys, Dt::f32, Tag::nchw);
  // Let oneDNN pick its fastest (blocked) layouts; we reorder at the edges. bf16 runs the
  // convolution on bf16 data with f32 accumulation and f32 weight gradients.
  const Dt ct = ComputeType(d.precision);
  const memory::desc x_any(xs, ct, Tag::any), w_any(ws, ct, Tag::any), y_any(ys, ct, Tag::any),
      dw_any(ws, Dt::f32, Tag::any);
  p->b_md = d.bias ? memory::desc({d.k}, Dt::f32, Tag::x) : memory::desc();
  const auto attr = MakeAttr();
  const auto alg = dnnl::algorithm::convolution_direct;
  const auto fwd = DPT_DNNL(dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x_any, w_any, p->b_md,
                                      y_any, strides, pad, pad),
      attr, eng));
  const auto data = DPT_DNNL(dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(alg, x_any, w_any, y_any, strides, pad, pad), attr, eng,
      fwd));
  const auto weights = DPT_DNNL(dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(alg, x_any, dw_any, p->b_md, y_any, strides, pad,
                                               pad),
      attr, eng, fwd));
  impl_->Finish(*this, p.get(), "conv2d", d.precision == Precision::kF16, fwd, data, weights,
                x_user, w_user, y_user, Shape{d.k, d.c, d.r, d.s});
  slot = p;
  return p;
}

void CpuBackend::Conv2dForward(const OpPlan& plan, const Tensor& x, const Tensor& w,
                               const Tensor* b, Tensor* y) {
  OpScope scope(this, "conv2d_fwd");
  const auto& p = static_cast<const ConvPlan&>(plan);
  CheckF32(x, "conv2d x");
  DPT_CHECK(x.numel() == p.d.n * p.d.c * p.d.h * p.d.w)
      << x.shape().ToString() << " for " << p.d.ToString();
  DPT_CHECK(!p.d.bias || b != nullptr) << "conv2d with bias needs a bias tensor";
  impl_->Forward(p, x, w, b, y);
}

void CpuBackend::Conv2dBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                    Tensor* dx) {
  OpScope scope(this, "conv2d_bwd_data");
  impl_->BackwardData(static_cast<const ConvPlan&>(plan), dy, w, dx);
}

void CpuBackend::Conv2dBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                       Tensor* dw, Tensor* db, bool accumulate) {
  OpScope scope(this, "conv2d_bwd_weights");
  impl_->BackwardWeights(static_cast<const ConvPlan&>(plan), x, dy, dw, db, accumulate);
}

// ---- linear ------------------------------------------------------------------------------

std::shared_ptr<OpPlan> CpuBackend::PrepareLinear(const LinearDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cpu: linear " << d.ToString();
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& slot = impl_->linear[LinearKey(d)];
  if (slot) return slot;
  auto p = std::make_shared<LinearPlan>();
  p->d = d;
  p->bias = d.bias;
  const auto& eng = impl_->engine;
  const memory::desc x_user({d.n, d.in}, Dt::f32, Tag::nc), w_user({d.out, d.in}, Dt::f32, Tag::oi),
      y_user({d.n, d.out}, Dt::f32, Tag::nc);
  // f32 runs on the caller's layouts (a GEMM; nothing to gain from reorders); bf16 stages the
  // operands as bf16 and keeps f32 outputs and weight gradients.
  const bool bf16 = d.precision == Precision::kBF16;
  const memory::desc x_md = bf16 ? memory::desc({d.n, d.in}, Dt::bf16, Tag::any) : x_user;
  const memory::desc w_md = bf16 ? memory::desc({d.out, d.in}, Dt::bf16, Tag::any) : w_user;
  const memory::desc y_md = bf16 ? memory::desc({d.n, d.out}, Dt::bf16, Tag::any) : y_user;
  const memory::desc dw_md = bf16 ? memory::desc({d.out, d.in}, Dt::f32, Tag::any) : w_user;
  p->b_md = d.bias ? memory::desc({d.out}, Dt::f32, Tag::x) : memory::desc();
  const auto attr = MakeAttr();
  const auto fwd = DPT_DNNL(dnnl::inner_product_forward::primitive_desc(
      dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, x_md, w_md, p->b_md,
                                        y_md),
      attr, eng));
  const auto data = DPT_DNNL(dnnl::inner_product_backward_data::primitive_desc(
      dnnl::inner_product_backward_data::desc(x_md, w_md, y_md), attr, eng, fwd));
  const auto weights = DPT_DNNL(dnnl::inner_product_backward_weights::primitive_desc(
      dnnl::inner_product_backward_weights::desc(x_md, dw_md, p->b_md, y_md), attr, eng, fwd));
  impl_->Finish(*this, p.get(), "linear", d.precision == Precision::kF16, fwd, data, weights,
                x_user, w_user, y_user, Shape{d.out, d.in});
  slot = p;
  return p;
}

void CpuBackend::LinearForward(const OpPlan& plan, const Tensor& x, const Tensor& w,
                               const Tensor* b, Tensor* y) {
  OpScope scope(this, "linear_fwd");
  const auto& p = static_cast<const LinearPlan&>(plan);
  CheckF32(x, "linear x");
  DPT_CHECK(x.numel() == p.d.n * p.d.in) << x.shape().ToString() << " for " << p.d.ToString();
  DPT_CHECK(!p.d.bias || b != nullptr) << "linear with bias needs a bias tensor";
  impl_->Forward(p, x, w, b, y);
}

void CpuBackend::LinearBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                    Tensor* dx) {
  OpScope scope(this, "linear_bwd_data");
  impl_->BackwardData(static_cast<const LinearPlan&>(plan), dy, w, dx);
}

void CpuBackend::LinearBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                       Tensor* dw, Tensor* db, bool accumulate) {
  OpScope scope(this, "linear_bwd_weights");
  impl_->BackwardWeights(static_cast<const LinearPlan&>(plan), x, dy, dw, db, accumulate);
}

// ---- pooling -----------------------------------------------------------------------------

std::shared_ptr<OpPlan> CpuBackend::PreparePool(const PoolDesc& d) {
  if (!Supports(d)) DPT_THROW(UnsupportedError) << "cpu: pool " << d.ToString();
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& slot = impl_->pool[PoolKey(d)];
  if (slot) return slot;
  auto p = std::make_shared<PoolPlan>();
  p->d = d;
  p->x_md = memory::desc({d.n, d.c, d.h, d.w}, Dt::f32, Tag::nchw);
  p->y_md = memory::desc({d.n, d.c, d.out_h(), d.out_w()}, Dt::f32, Tag::nchw);
  const memory::dims strides{d.stride, d.stride}, kernel{d.kernel, d.kernel}, pad{d.pad, d.pad};
  // PyTorch's AvgPool2d counts padded zeros (count_include_pad=True); MaxPool2d pads with -inf.
  const auto alg = d.kind == PoolKind::kMax ? dnnl::algorithm::pooling_max
                                            : dnnl::algorithm::pooling_avg_include_padding;
  const auto attr = MakeAttr();
  p->train_pd = DPT_DNNL(dnnl::pooling_forward::primitive_desc(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, p->x_md, p->y_md, strides,
                                  kernel, pad, pad),
      attr, impl_->engine));
  p->infer_pd = DPT_DNNL(dnnl::pooling_forward::primitive_desc(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_inference, alg, p->x_md, p->y_md,
                                  strides, kernel, pad, pad),
      attr, impl_->engine));
  p->bwd_pd = DPT_DNNL(dnnl::pooling_backward::primitive_desc(
      dnnl::pooling_backward::desc(alg, p->x_md, p->y_md, strides, kernel, pad, pad), attr,
      impl_->engine, p->train_pd));
  p->train = dnnl::pooling_forward(p->train_pd);
  p->infer = dnnl::pooling_forward(p->infer_pd);
  p->bwd = dnnl::pooling_backward(p->bwd_pd);
  p->workspace_bytes = d.kind == PoolKind::kMax ? p->train_pd.workspace_desc().get_size() : 0;
  impl_->Reserve(*this, p->train_pd.scratchpad_desc());
  impl_->Reserve(*this, p->infer_pd.scratchpad_desc());
  impl_->Reserve(*this, p->bwd_pd.scratchpad_desc());
  slot = p;
  return p;
}

void CpuBackend::PoolForward(const OpPlan& plan, const Tensor& x, Tensor* y, Tensor* ws) {
  OpScope scope(this, "pool_fwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  CheckF32(x, "pool x");
  DPT_CHECK(x.numel() == p.d.n * p.d.c * p.d.h * p.d.w)
      << x.shape().ToString() << " for " << p.d.ToString();
  const bool training = ws != nullptr || p.d.kind == PoolKind::kAvg;
  const auto& pd = training ? p.train_pd : p.infer_pd;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, impl_->Mem(p.x_md, x)},
                                       {DNNL_ARG_DST, impl_->Mem(p.y_md, *y)},
                                       {DNNL_ARG_SCRATCHPAD, impl_->Scratch(pd.scratchpad_desc())}};
  if (p.d.kind == PoolKind::kMax && ws != nullptr) {
    DPT_CHECK(ws->bytes() >= p.workspace_bytes) << "pool workspace too small";
    args.emplace(DNNL_ARG_WORKSPACE, impl_->Mem(p.train_pd.workspace_desc(), *ws));
  }
  DPT_DNNL((training ? p.train : p.infer).execute(impl_->stream, args));
}

void CpuBackend::PoolBackward(const OpPlan& plan, const Tensor& dy, const Tensor* ws, Tensor* dx) {
  OpScope scope(this, "pool_bwd");
  const auto& p = static_cast<const PoolPlan&>(plan);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_DIFF_DST, impl_->Mem(p.y_md, dy)},
      {DNNL_ARG_DIFF_SRC, impl_->Mem(p.x_md, *dx)},
      {DNNL_ARG_SCRATCHPAD, impl_->Scratch(p.bwd_pd.scratchpad_desc())}};
  if (p.d.kind == PoolKind::kMax) {
    DPT_CHECK(ws != nullptr) << "max-pool backward needs the forward workspace";
    args.emplace(DNNL_ARG_WORKSPACE, impl_->Mem(p.train_pd.workspace_desc(), *ws));
  }
  DPT_DNNL(p.bwd.execute(impl_->stream, args));
}

// ---- elementwise -------------------------------------------------------------------------

void CpuBackend::ReluForward(const Tensor& x, Tensor* y) {
  OpScope scope(this, "relu_fwd");
  CheckSame(x, *y, "relu");
  const float* in = x.data<float>();
  float* out = y->data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = ew::Relu(in[i]);
}

void CpuBackend::ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) {
  OpScope scope(this, "relu_bwd");
  CheckSame(y, dy, "relu backward");
  const float* yy = y.data<float>();
  const float* g = dy.data<float>();
  float* out = dx->data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = ew::ReluGrad(yy[i], g[i]);
}

void CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor* y) {
  OpScope scope(this, "add");
  CheckSame(a, b, "add");
  CheckSame(a, *y, "add");
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* out = y->data<float>();
  const int64_t n = a.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = pa[i] + pb[i];
}

void CpuBackend::Scale(Tensor* t, float alpha) {
  OpScope scope(this, "scale");
  float* p = t->data<float>();
  const int64_t n = t->numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
}

void CpuBackend::DropoutForward(const Tensor& x, float p, uint64_t seed, Tensor* y) {
  OpScope scope(this, "dropout");
  CheckSame(x, *y, "dropout");
  const float* in = x.data<float>();
  float* out = y->data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = ew::Dropout(in[i], seed, static_cast<uint64_t>(i), p);
}

void CpuBackend::DropoutBackward(const Tensor& dy, float p, uint64_t seed, Tensor* dx) {
  DropoutForward(dy, p, seed, dx);  // the same mask and scale
}

// ---- batch norm --------------------------------------------------------------------------

void CpuBackend::BatchNormForwardTraining(const BatchNormArgs& a, const Tensor& x,
                                          const Tensor& gamma, const Tensor& beta,
                                          Tensor* running_mean, Tensor* running_var, Tensor* y,
                                          Tensor* save_mean, Tensor* save_invstd) {
  OpScope scope(this, "batchnorm_fwd");
  const BatchNormDims d = BatchNormShape(x.shape());
  const float* in = x.data<float>();
  float* out = y->data<float>();
  const int64_t m = d.n * d.hw;
#pragma omp parallel for if (m * d.c > kParallelMin)
  for (int64_t c = 0; c < d.c; ++c) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < d.n; ++i) {
      const float* p = in + (i * d.c + c) * d.hw;
      for (int64_t j = 0; j < d.hw; ++j) sum += p[j];
    }
    const double mean = sum / static_cast<double>(m);
    for (int64_t i = 0; i < d.n; ++i) {
      const float* p = in + (i * d.c + c) * d.hw;
      for (int64_t j = 0; j < d.hw; ++j) sq += (p[j] - mean) * (p[j] - mean);
    }
    const double var = sq / static_cast<double>(m);
    const double invstd = ew::BnInvStd(var, a.eps);
    const ew::BnAffine affine =
        ew::BnFold(gamma.data<float>()[c], beta.data<float>()[c], static_cast<float>(mean), invstd);
    for (int64_t i = 0; i < d.n; ++i) {
      const float* p = in + (i * d.c + c) * d.hw;
      float* q = out + (i * d.c + c) * d.hw;
      for (int64_t j = 0; j < d.hw; ++j) q[j] = ew::BnApply(p[j], affine);
    }
    save_mean->data<float>()[c] = static_cast<float>(mean);
    save_invstd->data<float>()[c] = static_cast<float>(invstd);
    float& rm = running_mean->data<float>()[c];
    float& rv = running_var->data<float>()[c];
    rm = ew::BnRunning(rm, mean, a.momentum);
    rv = ew::BnRunning(rv, ew::BnUnbiasedVar(var, m), a.momentum);
  }
}

void CpuBackend::BatchNormForwardInference(const BatchNormArgs& a, const Tensor& x,
                                           const Tensor& gamma, const Tensor& beta,
                                           const Tensor& running_mean, const Tensor& running_var,
                                           Tensor* y) {
  OpScope scope(this, "batchnorm_infer");
  const BatchNormDims d = BatchNormShape(x.shape());
  const float* in = x.data<float>();
  float* out = y->data<float>();
#pragma omp parallel for if (d.n * d.c * d.hw > kParallelMin)
  for (int64_t c = 0; c < d.c; ++c) {
    const double invstd = ew::BnInvStd(running_var.data<float>()[c], a.eps);
    const ew::BnAffine affine = ew::BnFold(gamma.data<float>()[c], beta.data<float>()[c],
                                           running_mean.data<float>()[c], invstd);
    for (int64_t i = 0; i < d.n; ++i) {
      const float* p = in + (i * d.c + c) * d.hw;
      float* q = out + (i * d.c + c) * d.hw;
      for (int64_t j = 0; j < d.hw; ++j) q[j] = ew::BnApply(p[j], affine);
    }
  }
}

void CpuBackend::BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                   const Tensor& save_mean, const Tensor& save_invstd, Tensor* dx,
                                   Tensor* dgamma, Tensor* dbeta, bool accumulate) {
  OpScope scope(this, "batchnorm_bwd");
  const BatchNormDims d = BatchNormShape(x.shape());
  const float* in = x.data<float>();
  const float* g = dy.data<float>();
  float* out = dx->data<float>();
  const double m = static_cast<double>(d.n * d.hw);
#pragma omp parallel for if (d.n * d.c * d.hw > kParallelMin)
  for (int64_t c = 0; c < d.c; ++c) {
    const double mean = save_mean.data<float>()[c];
    const double invstd = save_invstd.data<float>()[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t i = 0; i < d.n; ++i) {
      const int64_t off = (i * d.c + c) * d.hw;
      for (int64_t j = 0; j < d.hw; ++j) {
        sum_dy += g[off + j];
        sum_dy_xhat += ew::BnDyXhat(g[off + j], in[off + j], mean, invstd);
      }
    }
    const double k = ew::BnGradScale(gamma.data<float>()[c], invstd, m);
    for (int64_t i = 0; i < d.n; ++i) {
      const int64_t off = (i * d.c + c) * d.hw;
      for (int64_t j = 0; j < d.hw; ++j) {
        out[off + j] = ew::BnDx(g[off + j], in[off + j], mean, invstd, k, m, sum_dy, sum_dy_xhat);
      }
    }
    float& dgc = dgamma->data<float>()[c];
    float& dbc = dbeta->data<float>()[c];
    dgc = ew::BnParamGrad(sum_dy_xhat, dgc, accumulate);
    dbc = ew::BnParamGrad(sum_dy, dbc, accumulate);
  }
}

// ---- losses ------------------------------------------------------------------------------

void CpuBackend::SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels, Tensor* probs,
                                     Tensor* loss_sum, Tensor* correct) {
  OpScope scope(this, "softmax_xent");
  DPT_CHECK(logits.shape().rank() == 2) << "logits " << logits.shape().ToString();
  const int64_t n = logits.shape()[0], k = logits.shape()[1];
  DPT_CHECK(labels.numel() == n && labels.dtype() == DType::kI32) << "labels for " << n;
  const float* x = logits.data<float>();
  const int32_t* y = labels.data<int32_t>();
  float* pr = probs->data<float>();
  double loss = 0;
  int64_t hits = 0, bad = -1;
#pragma omp parallel for reduction(+ : loss, hits) if (n * k > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x + i * k;
    float mx = row[0];
    int64_t arg = 0;
    for (int64_t j = 1; j < k; ++j) {
      if (row[j] > mx) {
        mx = row[j];
        arg = j;
      }
    }
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
    const double inv = 1.0 / sum;
    for (int64_t j = 0; j < k; ++j) {
      pr[i * k + j] = static_cast<float>(std::exp(static_cast<double>(row[j] - mx)) * inv);
    }
    const int32_t t = y[i];
    if (t < 0 || t >= k) {
#pragma omp critical
      bad = i;
      continue;
    }
    loss += std::log(sum) - static_cast<double>(row[t] - mx);
    hits += arg == t ? 1 : 0;
  }
  if (bad >= 0) {
    DPT_THROW(DataError) << "label " << y[bad] << " of sample " << bad
                         << " in the batch is outside [0, " << k << ")";
  }
  loss_sum->data<float>()[0] = static_cast<float>(loss);
  if (correct != nullptr) correct->data<float>()[0] = static_cast<float>(hits);
}

void CpuBackend::SoftmaxCrossEntropyBackward(const Tensor& probs, const Tensor& labels, float scale,
                                             Tensor* dlogits) {
  OpScope scope(this, "softmax_xent_bwd");
  const int64_t n = probs.shape()[0], k = probs.shape()[1];
  const float* pr = probs.data<float>();
  const int32_t* y = labels.data<int32_t>();
  float* out = dlogits->data<float>();
#pragma omp parallel for if (n * k > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      out[i * k + j] = ew::SoftmaxXentGrad(pr[i * k + j], j == y[i], scale);
    }
  }
}

void CpuBackend::MseLoss(const Tensor& y, const Tensor& t, Tensor* loss_sum) {
  OpScope scope(this, "mse");
  CheckSame(y, t, "mse");
  const float* a = y.data<float>();
  const float* b = t.data<float>();
  const int64_t n = y.numel();
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) sum += ew::SquaredError(a[i], b[i]);
  loss_sum->data<float>()[0] = static_cast<float>(sum);
}

void CpuBackend::MseBackward(const Tensor& y, const Tensor& t, float scale, Tensor* dy) {
  OpScope scope(this, "mse_bwd");
  CheckSame(y, t, "mse backward");
  const float* a = y.data<float>();
  const float* b = t.data<float>();
  float* out = dy->data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = ew::MseGrad(a[i], b[i], scale);
}

// ---- optimizers --------------------------------------------------------------------------

void CpuBackend::SgdStep(const ew::SgdHyper& h, Tensor* param, const Tensor& grad,
                         Tensor* momentum) {
  OpScope scope(this, "sgd");
  CheckSame(*param, grad, "sgd");
  float* p = param->data<float>();
  const float* g = grad.data<float>();
  float* buf = momentum != nullptr && momentum->defined() ? momentum->data<float>() : nullptr;
  DPT_CHECK(buf != nullptr || h.momentum == 0.f) << "sgd with momentum needs a momentum buffer";
  const int64_t n = param->numel();
  // The same ew::SgdUpdate either way; one loop per configuration keeps the per-element
  // branches and the pointer select out of the loop so it vectorises (2x on AVX-512).
  if (buf != nullptr) {
    ew::SgdHyper hm = h;
    if (!h.nesterov) {
      hm.nesterov = false;
#pragma omp parallel for simd if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) ew::SgdUpdate(hm, p + i, g[i], buf + i);
    } else {
#pragma omp parallel for simd if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) ew::SgdUpdate(h, p + i, g[i], buf + i);
    }
  } else {
    ew::SgdHyper h0 = h;
    h0.momentum = 0.f;
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      float unused = 0.f;
      ew::SgdUpdate(h0, p + i, g[i], &unused);
    }
  }
}

void CpuBackend::AdamWStep(const ew::AdamWHyper& h, Tensor* param, const Tensor& grad, Tensor* m,
                           Tensor* v) {
  OpScope scope(this, "adamw");
  CheckSame(*param, grad, "adamw");
  float* p = param->data<float>();
  const float* g = grad.data<float>();
  float* pm = m->data<float>();
  float* pv = v->data<float>();
  const int64_t n = param->numel();
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) ew::AdamWUpdate(h, p + i, g[i], pm + i, pv + i);
}

// ---- checks ------------------------------------------------------------------------------

int64_t CpuBackend::CountNonFinite(const Tensor& t) {
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) bad += ew::IsFinite(p[i]) ? 0 : 1;
  return bad;
}

double CpuBackend::SumSquares(const Tensor& t) {
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(p[i]) * p[i];
  return sum;
}

std::string OneDnnVersion() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

}  // namespace dptrain::cpu
