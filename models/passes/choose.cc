// SPDX-License-Identifier: Apache-2.0
// The choosing pass, node by node as the graph sets them up, once a node's input shapes are known:
// which of the offers fuse.cc found the backend runs (Backend::Supports of the fused or 16-bit
// descriptor), written into the node's descriptor, and told to the node's neighbours that
// depend on it (a convolution's bf16 output is its batch norm's bf16 input).
#include "models/graph.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/join.h"
#include "models/layers/pool.h"
#include "models/passes/passes.h"

namespace dptrain {

void GraphPasses::Choose(size_t i, const std::vector<Shape>& in, bool* nhwc, SetupOptions* opts) {
  // A layer whose readers would each transpose its channels-last output (flattens) writes NCHW
  // where it can as it goes (a max pool): ref_cnn's last pool, which saves both transposes.
  if (*nhwc && opts->nhwc_in && ReadersPreferNchw(i) && CanWriteNchwFromNhwc(i, in[0])) {
    *nhwc = false;
    opts->nhwc_out = false;
  }
  Layer& l = graph_.layer(i);
  if (dynamic_cast<Conv2d*>(&l) != nullptr) ChooseConv(i, in[0], *opts);
  if (dynamic_cast<BatchNorm*>(&l) != nullptr) ChooseBatchNorm(i, in[0], *opts);
  if (dynamic_cast<Pool2d*>(&l) != nullptr) ChoosePool(i);
  if (dynamic_cast<Add*>(&l) != nullptr) ChooseAdd(i, in, *opts);
}

void GraphPasses::ChooseConv(size_t i, const Shape& in, const SetupOptions& opts) {
  auto& conv = dynamic_cast<Conv2d&>(graph_.layer(i));
  Conv2dFusion& f = conv.fusion();
  f.pool_fused = f.y_bf16 = f.dy_bf16 = f.dx_sub = false;
  Conv2dDesc d = conv.Describe(in, opts);  // a shape it cannot take: the ConfigError, here
  if (!backend_.Supports(d)) return;       // Setup says so
  const Offers& o = offers_[i];
  const Shape out{in[0], d.k, d.out_h(), d.out_w()};
  // Run with the pool: no input gradient wanted (the fused op has no backward for it).
  if (o.pool_offered && opts.fuse_conv_pool && !opts.need_dx) {
    ConvPoolDesc fused{d, o.pool};
    fused.pool.n = out[0], fused.pool.c = out[1], fused.pool.h = out[2], fused.pool.w = out[3];
    fused.pool.nhwc = d.y_nhwc;  // the pool writes its input's layout
    if (backend_.Supports(fused)) {
      f.pool_fused = true;
      f.pool = fused;
      return;
    }
  }
  const bool bf16 = d.precision == Precision::kBF16;
  // dy in bf16 from the batch norm or pool that writes it: in bf16 the backward rounds dy to bf16
  // before it reads it; the same bits without the f32 gradient and the pass that rounded it.
  if (o.dy_writer != kNone && bf16) {
    Conv2dDesc t = d;
    t.dy_bf16 = true;
    d.dy_bf16 = f.dy_bf16 = backend_.Supports(t) && CanWriteBf16Dx(o.dy_writer, out, d.y_nhwc);
  }
  // y in bf16 for the layer that alone reads it, told before its Setup either way.
  if (o.y_reader != kNone && bf16) {
    Conv2dDesc t = d;
    t.y_bf16 = true;
    d.y_bf16 = f.y_bf16 =
        backend_.Supports(t) && CanReadBf16Input(o.y_reader, out, d.y_nhwc, d.precision);
  }
  if (o.y_reader != kNone) ReadBf16Input(o.y_reader, f.y_bf16);
  // A strided shortcut hands its input gradient sampled to the sum that adds it as it reads it.
  if (opts.sampled_input_grad && opts.need_dx) {
    Conv2dDesc t = d;
    t.dx_sub = true;
    f.dx_sub = backend_.Supports(t);
  }
}

void GraphPasses::ChooseBatchNorm(size_t i, const Shape& in, const SetupOptions& opts) {
  auto& bn = dynamic_cast<BatchNorm&>(graph_.layer(i));
  BatchNormFusion& f = bn.fusion();
  const bool image = in.rank() == 4;
  BatchNormArgs a = bn.BaseArgs();
  a.nhwc = opts.nhwc_in && image;
  a.x_bf16 = f.x_bf16;
  // dx in bf16 where the convolution before, which only it reads, takes dy so.
  const std::vector<int>& inputs = graph_.inputs(i);
  const int p = inputs.size() == 1 ? inputs[0] : Graph::kInput;
  const auto* conv =
      p != Graph::kInput && offers_[static_cast<size_t>(p)].dy_writer == static_cast<int>(i)
          ? dynamic_cast<const Conv2d*>(&graph_.layer(static_cast<size_t>(p)))
          : nullptr;
  a.dx_bf16 = f.dx_bf16 = conv != nullptr && conv->reads_dy_bf16();
  // y in bf16 for the bf16 convolution that alone reads it; not without need_dx, where the
  // backward writes its f32 dx over the output buffer.
  f.y_bf16 = false;
  const Offers& o = offers_[i];
  if (o.y_reader != kNone) {
    BatchNormArgs t = a;
    t.y_bf16 = true;
    f.y_bf16 = opts.need_dx && image && backend_.Supports(t) &&
               CanReadBf16Input(o.y_reader, in, a.nhwc, opts.precision);
    ReadBf16Input(o.y_reader, f.y_bf16);
  }
  // Applied by the reading sum (Backend::AffineAdd) on channels-last images without a folded
  // ReLU; not without need_dx, where the backward would write its dx over the output buffer,
  // which there is not then.
  f.deferred = o.defer_offered && !a.relu && !f.y_bf16 && opts.need_dx && image && a.nhwc &&
               backend_.capabilities().deferred_batch_norm;
}

void GraphPasses::ChoosePool(size_t i) {
  auto& pool = dynamic_cast<Pool2d&>(graph_.layer(i));
  // The bf16 convolution before this pool reads its gradient in bf16: written so here (unless
  // the pool runs it).
  const Conv2d* conv = pool.fusion().conv;
  pool.fusion().dx_bf16 = conv != nullptr && conv->pool_fused() == nullptr && conv->reads_dy_bf16();
}

void GraphPasses::ChooseAdd(size_t i, const std::vector<Shape>& in, const SetupOptions& opts) {
  auto& add = dynamic_cast<Add&>(graph_.layer(i));
  AddFusion& f = add.fusion();
  f.y_bf16 = false;
  if (in.size() < 2) return;  // Setup says so
  size_t wide = 0;
  const bool broadcast = Add::Broadcasts(in, &wide);
  // The broadcast sums (N, C) into (N, C, H, W) viewed as N * C rows: NCHW only.
  if (broadcast && opts.nhwc_in) throw NhwcRefused{};
  const Offers& o = offers_[i];
  if (o.y_readers.empty()) return;
  // A bf16 output for the bf16 convolutions that alone read it, where a batch norm it applies was
  // deferred to it (AffineAdd writes it).
  const bool applies = (f.applies[0] != nullptr && f.applies[0]->deferred_affine() != nullptr) ||
                       (f.applies[1] != nullptr && f.applies[1]->deferred_affine() != nullptr);
  const Shape& out = in[wide];
  bool y = applies && f.relu && !broadcast && in.size() == 2 && opts.need_dx && opts.nhwc_in &&
           opts.precision == Precision::kBF16 && backend_.capabilities().bf16_sums;
  for (int r : o.y_readers) y = y && CanReadBf16Input(r, out, opts.nhwc_in, opts.precision);
  for (int r : o.y_readers) ReadBf16Input(r, y);
  f.y_bf16 = y;
}

bool GraphPasses::CanReadBf16Input(int r, const Shape& in, bool nhwc, Precision p) const {
  Layer& l = graph_.layer(static_cast<size_t>(r));
  if (p != Precision::kBF16 || in.rank() != 4) return false;
  if (auto* conv = dynamic_cast<Conv2d*>(&l)) {
    if (offers_[static_cast<size_t>(r)].pool_offered) return false;
    Conv2dDesc d = conv->DescFor(in, p, nhwc, nhwc);
    d.x_bf16 = true;
    return backend_.Supports(d);
  }
  if (auto* bn = dynamic_cast<BatchNorm*>(&l)) {
    BatchNormArgs a = bn->BaseArgs();
    a.nhwc = nhwc;
    a.x_bf16 = true;
    return nhwc && backend_.Supports(a);
  }
  return false;
}

bool GraphPasses::CanWriteBf16Dx(int w, const Shape& in, bool nhwc) const {
  Layer& l = graph_.layer(static_cast<size_t>(w));
  if (auto* bn = dynamic_cast<BatchNorm*>(&l)) {
    BatchNormArgs a = bn->BaseArgs();
    a.nhwc = nhwc && in.rank() == 4;
    a.dx_bf16 = true;
    return backend_.Supports(a);
  }
  if (auto* pool = dynamic_cast<Pool2d*>(&l)) {
    if (in.rank() != 4) return false;
    PoolDesc d = pool->DescFor(in, nhwc);
    d.dx_bf16 = true;
    return d.Valid() && backend_.Supports(d);
  }
  return false;
}

void GraphPasses::ReadBf16Input(int r, bool bf16) {
  Layer& l = graph_.layer(static_cast<size_t>(r));
  if (auto* conv = dynamic_cast<Conv2d*>(&l)) conv->fusion().x_bf16 = bf16;
  if (auto* bn = dynamic_cast<BatchNorm*>(&l)) bn->fusion().x_bf16 = bf16;
}

}  // namespace dptrain
