// SPDX-License-Identifier: Apache-2.0
// The CPU backend's oneDNN plumbing shared by conv2d and linear: staging operands between the
// caller's f32 layouts and a primitive's own (with fp16 emulation), the shared scratchpad, the
// three primitives' execution, and the bf16 support probe.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <dnnl.hpp>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cpu/cpu_backend_impl.h"
#include "core/elementwise.h"
#include "core/error.h"

namespace dptrain::cpu {
namespace {

// Rounds n floats to the nearest fp16 values (ew::RoundToHalf), from x into y (may alias).
void RoundToHalf(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = ew::RoundToHalf(x[i]);
}

// Whether staging `user` as `inner` only rounds each f32 to bf16, both dense in one order: then
// In() converts with Bf16Bits16 (ew::FloatToBf16's bits) instead of oneDNN's reorder, whose
// jit:uni kernel took 0.11 ms for ref_cnn's fc1 input (64 x 3136) on 2 threads.
bool PlainToBf16(const memory::desc& user, const memory::desc& inner) {
  const dnnl_memory_desc_t &u = user.data, &i = inner.data;
  if (u.data_type != dnnl_f32 || i.data_type != dnnl_bf16 || u.format_kind != dnnl_blocked ||
      i.format_kind != dnnl_blocked || u.ndims != i.ndims || u.offset0 != 0 || i.offset0 != 0 ||
      u.format_desc.blocking.inner_nblks != 0 || i.format_desc.blocking.inner_nblks != 0) {
    return false;
  }
  int64_t numel = 1;
  for (int d = 0; d < u.ndims; ++d) {
    if (u.dims[d] != i.dims[d] || u.padded_dims[d] != u.dims[d] || i.padded_dims[d] != i.dims[d] ||
        u.format_desc.blocking.strides[d] != i.format_desc.blocking.strides[d]) {
      return false;
    }
    numel *= u.dims[d];
  }
  return user.get_size() == static_cast<size_t>(numel) * sizeof(float) &&
         inner.get_size() == static_cast<size_t>(numel) * sizeof(uint16_t);
}

DPT_SIMD_CLONES void ToBf16Run(const float* in, uint16_t* out, int64_t n) {
  Bf16BitsRun(in, out, n);
}

void ToBf16(const float* in, uint16_t* out, int64_t n) {
  constexpr int64_t kRun = 4096;
  const int64_t runs = (n + kRun - 1) / kRun;
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t r = 0; r < runs; ++r) {
    ToBf16Run(in + r * kRun, out + r * kRun, std::min(kRun, n - r * kRun));
  }
}

// y[i] += x[i]
void AddInto(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace

dnnl::primitive_attr MakeAttr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void Staged::Init(CpuBackend& be, const dnnl::engine& eng, const memory::desc& user_md,
                  const memory::desc& inner_md, const std::string& label, bool round_half,
                  bool is_input, const Staged* share) {
  user = user_md;
  inner = inner_md;
  same = user_md == inner_md;
  half = round_half;
  label_ = label;
  is_input_ = is_input;
  copies.assign(1, Copy{});
  if (share != nullptr && ReadsLike(*share) && share->user == user_md) {
    copies[0].buf = share->copies[0].buf;
    copies[0].rounded = share->copies[0].rounded;
    to_inner = share->to_inner;
    to_user = share->to_user;
    plain_bf16_ = share->plain_bf16_;
    return;
  }
  plain_bf16_ = !half && PlainToBf16(user_md, inner_md);
  if (!same) {
    to_inner = dnnl::reorder(memory(user_md, eng, nullptr), memory(inner_md, eng, nullptr));
    to_user = dnnl::reorder(memory(inner_md, eng, nullptr), memory(user_md, eng, nullptr));
  }
  copies.clear();
  (void)AddCopy(be);
}

size_t Staged::AddCopy(CpuBackend& be) {
  Copy c;
  if (half && is_input_) {
    c.rounded = be.Empty(Shape{static_cast<int64_t>(user.get_size() / sizeof(float))}, DType::kF32,
                         label_ + " (fp16 values)");
  }
  if (!same) c.buf = be.Empty(Shape{static_cast<int64_t>(inner.get_size())}, DType::kU8, label_);
  const size_t bytes =
      (c.buf.defined() ? c.buf.bytes() : 0) + (c.rounded.defined() ? c.rounded.bytes() : 0);
  if (!copies.empty() && bytes == 0) return 0;
  copies.push_back(std::move(c));
  return bytes;
}

const Staged::Copy* Staged::Holding(const Tensor& t) const {
  for (const Copy& c : copies) {
    if (c.src != nullptr && c.src == t.raw()) return &c;
  }
  return nullptr;
}

memory Staged::In(const dnnl::engine& eng, dnnl::stream& st, const Tensor& t) const {
  const Copy* c = Holding(t);
  if (c == nullptr) {
    c = &copies[0];
    for (const Copy& o : copies) c = o.used < c->used ? &o : c;
  }
  c->used = ++clock_;
  c->src = nullptr;  // until staged: a failed reorder leaves nothing to reuse
  void* src_ptr = t.raw();
  if (half) {
    RoundToHalf(t.data<float>(), c->rounded.data<float>(), c->rounded.numel());
    src_ptr = c->rounded.raw();
  }
  if (same) {
    c->src = t.raw();
    return memory(user, eng, src_ptr);
  }
  memory in(inner, eng, c->buf.raw());
  if (plain_bf16_) {
    ToBf16(static_cast<const float*>(src_ptr), static_cast<uint16_t*>(c->buf.raw()),
           static_cast<int64_t>(user.get_size() / sizeof(float)));
  } else {
    memory src(user, eng, src_ptr);
    to_inner.execute(st, src, in);
  }
  c->src = t.raw();
  return in;
}

memory Staged::Again(const dnnl::engine& eng, const Tensor& t) const {
  const Copy* c = Holding(t);
  DPT_CHECK(c != nullptr) << "staged operand asked again for another tensor";
  void* src_ptr = half ? c->rounded.raw() : t.raw();
  return same ? memory(user, eng, src_ptr) : memory(inner, eng, c->buf.raw());
}

memory Staged::OutMem(const dnnl::engine& eng, const Tensor& t) const {
  return same ? memory(user, eng, t.raw()) : memory(inner, eng, copies[0].buf.raw());
}

void Staged::Out(const dnnl::engine& eng, dnnl::stream& st, const Tensor& t) const {
  if (!same) {
    memory src(inner, eng, copies[0].buf.raw());
    memory dst(user, eng, t.raw());
    to_user.execute(st, src, dst);
  }
  if (half) RoundToHalf(t.data<float>(), t.data<float>(), t.numel());
}

size_t HeldBytes(std::initializer_list<const Staged*> staged,
                 std::initializer_list<const Tensor*> tensors) {
  size_t n = 0;
  std::set<const void*> seen;  // a buffer shared by two Staged counts once
  const auto add = [&](const Tensor& t) {
    if (t.defined() && seen.insert(t.raw()).second) n += t.bytes();
  };
  for (const Staged* st : staged) {
    for (const Staged::Copy& c : st->copies) {
      add(c.buf);
      add(c.rounded);
    }
  }
  for (const Tensor* t : tensors) n += t->defined() ? t->bytes() : 0;
  return n;
}

namespace {
// *buf of at least `bytes` (at least 1): kept when large enough, else replaced, the smaller one
// let go first so that the two are never held at once.
void Grow(CpuBackend& be, Tensor* buf, size_t bytes, const char* label) {
  if (buf->defined() && buf->bytes() >= bytes) return;
  *buf = Tensor();
  *buf = be.Empty(Shape{static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::kU8, label);
}
}  // namespace

void CpuBackend::Impl::Reserve(CpuBackend& be, const memory::desc& md) {
  Grow(be, &scratchpad, md.get_size(), "onednn scratchpad");
}

void CpuBackend::Impl::ReserveTransient(CpuBackend& be, size_t bytes) {
  Grow(be, &transient, bytes, "conv2d transient buffer");
}

Tensor CpuBackend::Impl::Transient(const Shape& shape, DType dtype) {
  ReserveTransient(*owner, static_cast<size_t>(shape.numel()) * SizeOf(dtype));
  return transient.View(shape, dtype, 0);
}

void CpuBackend::Impl::Forward(const WeightedPlan& p, const Tensor& x, const Tensor& w,
                               const Tensor* b, Tensor* y) {
  memory w_in = p.f_w.In(engine, stream, w);
  if (p.fwd_w_view) w_in = memory(p.fwd_w_view, engine, w_in.get_data_handle());
  memory y_out = p.f_y.OutMem(engine, *y);
  if (p.fwd_y_view) y_out = memory(p.fwd_y_view, engine, y_out.get_data_handle());
  const auto* conv = dynamic_cast<const ConvPlan*>(&p);
  memory x_in;
  if (conv != nullptr && conv->gemm) {
    conv->cols_x = nullptr;  // until unfolded: a failure leaves nothing to reuse
    Unfold(*conv, x, conv->cols);
    conv->cols_x = x.raw();
    x_in = memory(conv->cols_md, engine, conv->cols.raw());
  } else {
    x_in = p.f_x.In(engine, stream, x);
  }
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, x_in},
                                       {DNNL_ARG_WEIGHTS, w_in},
                                       {DNNL_ARG_DST, y_out},
                                       {DNNL_ARG_SCRATCHPAD, Scratch(p.fwd_scratch)}};
  if (p.bias) args.emplace(DNNL_ARG_BIAS, Mem(p.b_md, *b));
  DPT_DNNL(p.fwd.execute(stream, args));
  p.f_y.Out(engine, stream, *y);
}

void CpuBackend::Impl::BackwardData(const WeightedPlan& p, const memory& dy_in, const memory& w_in,
                                    Tensor* dx) {
  // A matmul's operands are SRC, WEIGHTS and DST: dx = dy W; so are a forward convolution's
  // (WeightedPlan::data_flip): dx = dy conv w flipped.
  const bool forward = p.matmul || p.data_flip;
  const auto* conv = dynamic_cast<const ConvPlan*>(&p);
  if (conv != nullptr && conv->gemm) {  // dcols = dy W, then summed into dx
    const Tensor dcols =
        Transient(Shape{static_cast<int64_t>(conv->dcols_md.get_size() / 4)}, DType::kF32);
    DPT_DNNL(p.bwd_data.execute(
        stream, {{DNNL_ARG_SRC, memory(conv->data_dy_view, engine, dy_in.get_data_handle())},
                 {DNNL_ARG_WEIGHTS, memory(conv->data_w_view, engine, w_in.get_data_handle())},
                 {DNNL_ARG_DST, memory(conv->dcols_md, engine, dcols.raw())},
                 {DNNL_ARG_SCRATCHPAD, Scratch(p.data_scratch)}}));
    Col2Im(*conv, dcols, *dx);
    return;
  }
  if (conv != nullptr && !conv->phases.empty()) {  // dx by phases, w_in the caller's f32 w
    const Conv2dDesc& d = conv->d;
    const auto* w = static_cast<const float*>(w_in.get_data_handle());
    float* taps = conv->phase_taps.data<float>();
    const int64_t part = d.n * d.c * d.out_h() * d.out_w();
    const Tensor parts = Transient(Shape{2 * part}, DType::kF32);
    for (size_t k = 0; k < 4; ++k) {
      const ConvPlan::Phase& ph = conv->phases[k];
      // (c, k, th, tw) = w (k, c, kh, kw): an even phase's tap 1, an odd one's taps 2 then 0
      const int64_t rows = 1 + static_cast<int64_t>(k / 2), cols = 1 + static_cast<int64_t>(k % 2);
      const auto tap = [](int64_t odd, int64_t t) { return odd == 0 ? 1 : 2 - 2 * t; };
      for (int64_t c = 0; c < d.c; ++c) {
        for (int64_t o = 0; o < d.k; ++o) {
          for (int64_t th = 0; th < rows; ++th) {
            for (int64_t tw = 0; tw < cols; ++tw) {
              taps[((c * d.k + o) * rows + th) * cols + tw] =
                  w[((o * d.c + c) * 3 + tap(rows - 1, th)) * 3 + tap(cols - 1, tw)];
            }
          }
        }
      }
      memory src(ph.w_user, engine, taps), dst(ph.w_md, engine, ph.w.raw());
      DPT_DNNL(ph.w_reorder.execute(stream, src, dst));
      DPT_DNNL(ph.prim.execute(
          stream, {{DNNL_ARG_SRC, dy_in},
                   {DNNL_ARG_WEIGHTS, dst},
                   {DNNL_ARG_DST, memory(ph.out_md, engine, parts.data<float>() + k % 2 * part)},
                   {DNNL_ARG_SCRATCHPAD, Scratch(ph.scratch)}}));
      if (k % 2 == 1) Interleave(*conv, parts, static_cast<int64_t>(k / 2), *dx);
    }
    return;
  }
  // A subsampled plan's dx_sub, spread into dx, unless the caller takes dx_sub as dx itself.
  const bool sub = conv != nullptr && conv->subsample && !conv->d.dx_sub;
  const Tensor out = sub ? Transient(conv->dx_sub, DType::kF32) : *dx;
  DPT_DNNL(p.bwd_data.execute(
      stream, {{forward ? DNNL_ARG_SRC : DNNL_ARG_DIFF_DST, dy_in},
               {DNNL_ARG_WEIGHTS, w_in},
               {forward ? DNNL_ARG_DST : DNNL_ARG_DIFF_SRC, p.d_dx.OutMem(engine, out)},
               {DNNL_ARG_SCRATCHPAD, Scratch(p.data_scratch)}}));
  p.d_dx.Out(engine, stream, out);
  if (sub) Spread(*conv, out, *dx);
}

namespace {
// out[j] = the sum over the rows of column j of the (rows, cols) matrix a (in double, rows in
// order: the same bits on any thread count).
void ColumnSums(const float* a, int64_t rows, int64_t cols, float* out) {
  std::vector<double> acc(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = a + r * cols;
    for (int64_t j = 0; j < cols; ++j) acc[static_cast<size_t>(j)] += row[j];
  }
  for (int64_t j = 0; j < cols; ++j) out[j] = static_cast<float>(acc[static_cast<size_t>(j)]);
}

// out[i] = the sum of row i of the (rows, cols) bf16 matrix a (in double, in order).
void RowSumsBf16(const uint16_t* a, int64_t rows, int64_t cols, float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    double acc = 0;
    for (int64_t j = 0; j < cols; ++j) acc += ew::Bf16ToFloat(a[i * cols + j]);
    out[i] = static_cast<float>(acc);
  }
}
}  // namespace

void CpuBackend::Impl::BackwardWeights(const WeightedPlan& p, const memory& x_in,
                                       const memory& dy_in, const Tensor& dy, Tensor* dw,
                                       Tensor* db, bool accumulate) {
  const auto* conv = dynamic_cast<const ConvPlan*>(&p);
  if (conv != nullptr && conv->tiles) {  // the caller's x and dy (x_in, dy_in), into dw itself
    const Tensor scratch = Transient(
        Shape{static_cast<int64_t>(TileScratchBytes(conv->d, conv->tile_threads))}, DType::kU8);
    TileWeightGradient(conv->d, x_in.get_data_handle(), dy_in.get_data_handle(), scratch,
                       std::min(conv->tile_threads, omp_get_max_threads()), dw->data<float>(),
                       p.bias ? db->data<float>() : nullptr, accumulate);
    return;
  }
  Tensor w_out = accumulate ? p.acc_w : *dw;
  Tensor b_out = accumulate ? p.acc_b : (p.bias ? *db : Tensor());
  std::unordered_map<int, memory> args{{DNNL_ARG_SCRATCHPAD, Scratch(p.weights_scratch)}};
  if (p.weights_matmul) {  // dW = dy^T x
    args.emplace(DNNL_ARG_SRC, memory(p.w_dy_view, engine, dy_in.get_data_handle()));
    args.emplace(DNNL_ARG_WEIGHTS, x_in);
    memory dw_mem = p.w_dw.OutMem(engine, w_out);
    if (p.w_dw_view) dw_mem = memory(p.w_dw_view, engine, dw_mem.get_data_handle());
    args.emplace(DNNL_ARG_DST, dw_mem);
  } else {
    args.emplace(DNNL_ARG_SRC, x_in);
    args.emplace(DNNL_ARG_DIFF_DST, dy_in);
    args.emplace(DNNL_ARG_DIFF_WEIGHTS, p.w_dw.OutMem(engine, w_out));
    if (p.bias) args.emplace(DNNL_ARG_DIFF_BIAS, Mem(p.b_md, b_out));
  }
  DPT_DNNL(p.bwd_w.execute(stream, args));
  p.w_dw.Out(engine, stream, w_out);
  FinishWeights(p, dy_in, dy, b_out, dw, db, accumulate);
}

void CpuBackend::Impl::FinishWeights(const WeightedPlan& p, const memory& dy_in, const Tensor& dy,
                                     const Tensor& b_out, Tensor* dw, Tensor* db, bool accumulate) {
  if (p.weights_matmul && p.bias) {
    const int64_t cols = b_out.numel();
    if (dynamic_cast<const ConvPlan*>(&p) != nullptr) {
      // from dy as the GEMM read it, (K, N*OH*OW) in bf16, as oneDNN's kernel sums it
      RowSumsBf16(static_cast<const uint16_t*>(dy_in.get_data_handle()), cols, dy.numel() / cols,
                  b_out.data<float>());
    } else {
      ColumnSums(dy.data<float>(), dy.numel() / cols, cols, b_out.data<float>());
    }
  }
  if (accumulate) {
    AddInto(p.acc_w.data<float>(), dw->data<float>(), dw->numel());
    if (p.bias) AddInto(p.acc_b.data<float>(), db->data<float>(), db->numel());
  }
}

void CpuBackend::WeightedBackward(const OpPlan& plan, double flops, const char* weights_op,
                                  const char* data_op, const Tensor& x, const Tensor& dy,
                                  const Tensor& w, Tensor* dx, Tensor* dw, Tensor* db,
                                  bool accumulate) {
  const auto& p = static_cast<const WeightedPlan&>(plan);
  memory dy_in;
  {
    OpScope scope(this, weights_op);
    scope.set_flops(flops);
    const memory x_in = impl_->WeightsX(p, x, /*from_forward=*/true);
    dy_in = p.w_dy.In(impl_->engine, impl_->stream, dy);
    impl_->BackwardWeights(p, x_in, dy_in, dy, dw, db, accumulate);
  }
  if (dx == nullptr) return;
  OpScope scope(this, data_op);
  scope.set_flops(flops);
  const memory w_in = impl_->DataW(p, w, /*from_forward=*/true);
  impl_->BackwardData(p, impl_->DyForData(p, dy, dy_in), w_in, dx);
}

namespace {
// oneDNN runs bf16 convolutions and matmuls (linear) only on CPUs with AVX-512 (avx512_core and
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
      const memory::desc m({1, 1}, Dt::bf16, Tag::ab), mo({1, 1}, Dt::f32, Tag::ab);
      const auto mm = dnnl::matmul::primitive_desc(dnnl::matmul::desc(m, m, mo), eng);
      (void)conv;
      (void)mm;
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}
}  // namespace

bool PrecisionOk(Precision p) { return p != Precision::kBF16 || OneDnnHasBf16(); }

}  // namespace dptrain::cpu
