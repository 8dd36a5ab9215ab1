// SPDX-License-Identifier: Apache-2.0
// Model: flat buffers, initialisation and the reverse-order layout that lets gradient buckets
// be reduced while backward is still running.
#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/util/rng.h"

namespace dptrain {
namespace {

constexpr int64_t kAlign = 16;  // floats: every tensor starts on a 64-byte boundary
int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Lays out `refs` in reverse order into one buffer; returns the total (aligned) length and
// fills offsets (indexed like refs).
int64_t LayoutReverse(const std::vector<ParamRef>& refs, std::vector<int64_t>* offsets) {
  offsets->assign(refs.size(), 0);
  int64_t off = 0;
  for (size_t i = refs.size(); i-- > 0;) {
    (*offsets)[i] = off;
    off += AlignUp(refs[i].shape.numel());
  }
  return std::max<int64_t>(off, 1);
}

// Prefixes the names of the entries appended to `out` since index `from` with "prefix.".
void PrefixNames(const std::string& prefix, size_t from, std::vector<ParamRef>* out) {
  if (prefix.empty()) return;
  for (size_t i = from; i < out->size(); ++i) (*out)[i].name = prefix + "." + (*out)[i].name;
}

}  // namespace

Model::Model(Backend& be, std::unique_ptr<Graph> net, Shape input_shape)
    : backend_(be), net_(std::move(net)), input_shape_(std::move(input_shape)) {}

void Model::Setup(int64_t max_batch, Precision precision, const FlatLayout& layout) {
  DPT_CHECK(max_batch > 0);
  max_batch_ = max_batch;
  std::vector<int64_t> in_dims{max_batch};
  for (int64_t d : input_shape_.dims()) in_dims.push_back(d);
  SetupOptions opts;
  opts.precision = precision;
  opts.need_dx = false;
  output_shape_ = net_->Setup(Shape(in_dims), opts);

  // Parameters per graph node, so we know how much of the gradient buffer is final after each
  // node's backward.
  param_refs_.clear();
  buffer_refs_.clear();
  std::vector<size_t> child_end;  // param_refs_ index after each node
  for (size_t i = 0; i < net_->size(); ++i) {
    Layer& l = net_->layer(i);
    size_t from = param_refs_.size();
    l.ListParams(&param_refs_);
    PrefixNames(l.name(), from, &param_refs_);
    child_end.push_back(param_refs_.size());
    from = buffer_refs_.size();
    l.ListBuffers(&buffer_refs_);
    PrefixNames(l.name(), from, &buffer_refs_);
  }

  // Reverse order, child by child (last child first), each tensor 64-byte aligned. After child
  // c's backward, every parameter of children >= c is final: [0, end of child c's region).
  const size_t children = net_->size();
  // Lays the parameters out with groups of at most `cap` floats (0: no cap); returns the end.
  const auto lay_out = [&](int64_t cap) {
    param_offsets_.assign(param_refs_.size(), 0);
    ready_after_child_.assign(children, -1);
    group_of_child_.assign(children, -1);
    groups_.clear();
    group_params_.clear();
    int64_t off = 0, group_begin = 0;
    size_t prev_child = children;  // the last node with parameters laid out
    for (size_t c = children; c-- > 0;) {
      const size_t begin = c == 0 ? 0 : child_end[c - 1];
      if (begin == child_end[c]) continue;  // no parameters
      if (cap > 0 && off > group_begin) {
        int64_t floats = 0;
        for (size_t i = begin; i < child_end[c]; ++i) {
          floats += AlignUp(param_refs_[i].shape.numel());
        }
        if (off - group_begin + floats > cap) {  // close the open group before this node
          off = (off + layout.group_multiple - 1) / layout.group_multiple * layout.group_multiple;
          groups_.emplace_back(group_begin, off);
          group_begin = off;
          ready_after_child_[prev_child] = off;  // the padding is final too
        }
      }
      prev_child = c;
      for (size_t i = child_end[c]; i-- > begin;) {
        param_offsets_[i] = off;
        off += AlignUp(param_refs_[i].shape.numel());
      }
      if (layout.group_multiple > 0) {
        if (group_params_.size() == groups_.size()) group_params_.emplace_back();
        for (size_t i = begin; i < child_end[c]; ++i) group_params_.back().push_back(i);
        group_of_child_[c] = static_cast<int>(groups_.size());
        const int64_t want = groups_.empty() ? layout.first_group_floats : layout.group_floats;
        const bool last = begin == 0;
        if (off - group_begin >= want || last) {
          off = (off + layout.group_multiple - 1) / layout.group_multiple * layout.group_multiple;
          groups_.emplace_back(group_begin, off);
          group_begin = off;
        }
      }
      ready_after_child_[c] = off;
    }
    if (layout.group_multiple > 0 && groups_.empty()) {
      // No parameters at all: one group of padding, so every rank still has a shard.
      off = layout.group_multiple;
      groups_.emplace_back(0, off);
      group_params_.emplace_back();
    }
    return off;
  };
  int64_t cap = 0;  // FlatLayout::group_cap of the whole layout, 0: none
  if (layout.group_multiple > 0 && layout.group_cap) {
    int64_t total = 0;
    for (const auto& r : param_refs_) total += AlignUp(r.shape.numel());
    cap = std::max<int64_t>(layout.group_cap(total), 0);
  }
  int64_t off = lay_out(cap);
  // A layout without flat gradients that FlatLayout::keep_flat_grads turns down keeps them, and
  // the groups it would have had without the cap (those of dist.shard = "optimizer").
  const bool flat_grads =
      layout.flat_grads || (layout.keep_flat_grads && layout.keep_flat_grads(groups_));
  if (flat_grads && !layout.flat_grads && cap > 0) off = lay_out(0);
  flat_floats_ = std::max<int64_t>(off, 1);
  std::vector<int64_t> boff;
  const int64_t btotal = LayoutReverse(buffer_refs_, &boff);
  params_ = backend_.Zeros(Shape{flat_floats_}, DType::kF32, "parameters (flat)");
  grads_ =
      flat_grads ? backend_.Zeros(Shape{flat_floats_}, DType::kF32, "gradients (flat)") : Tensor();
  buffers_ = backend_.Zeros(Shape{btotal}, DType::kF32, "buffers (flat)");
  named_params_.clear();
  named_grads_.clear();
  named_buffers_.clear();
  for (size_t i = 0; i < param_refs_.size(); ++i) {
    const auto& r = param_refs_[i];
    for (const auto& np : named_params_) {
      DPT_CHECK_AS(ConfigError, np.name != r.name)
          << "two parameters are named '" << r.name << "'; give the layers distinct names";
    }
    const auto at = static_cast<size_t>(param_offsets_[i]) * 4;
    *r.value = params_.View(r.shape, at);
    named_params_.push_back({r.name, *r.value, param_offsets_[i]});
    if (flat_grads) {
      *r.grad = grads_.View(r.shape, at);
      named_grads_.push_back({r.name, *r.grad, param_offsets_[i]});
    }
  }
  for (size_t i = 0; i < buffer_refs_.size(); ++i) {
    const auto& r = buffer_refs_[i];
    *r.value = buffers_.View(r.shape, static_cast<size_t>(boff[i]) * 4);
    named_buffers_.push_back({r.name, *r.value, boff[i]});
  }
  // Children without parameters inherit the readiness of the next child with parameters after
  // them (everything after them in forward order is already final).
  int64_t ready = 0;
  for (size_t c = children; c-- > 0;) {
    if (ready_after_child_[c] < 0) ready_after_child_[c] = ready;
    ready = ready_after_child_[c];
  }

  summary_.clear();
  for (size_t i = 0; i < net_->size(); ++i) {
    Layer& l = net_->layer(i);
    std::vector<ParamRef> refs;
    l.ListParams(&refs);
    int64_t count = 0;
    for (const auto& r : refs) count += r.shape.numel();
    std::ostringstream os;
    os << (net_->node_name(i).empty() ? "-" : net_->node_name(i)) << " " << l.type()
       << " params=" << count;
    summary_.push_back(os.str());
  }
}

void Model::InitParams(uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(params_.numel()), 0.f);
  SplitMix64 rng(seed);
  // Forward order, like PyTorch's module construction order.
  for (size_t i = 0; i < param_refs_.size(); ++i) {
    const auto& r = param_refs_[i];
    float* p = host.data() + named_params_[i].offset;
    const int64_t n = r.shape.numel();
    switch (r.init) {
      case Init::kZeros:
        std::fill(p, p + n, 0.f);
        break;
      case Init::kOnes:
        std::fill(p, p + n, 1.f);
        break;
      case Init::kFanInUniform: {
        const double bound = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(r.fan_in, 1)));
        for (int64_t j = 0; j < n; ++j)
          p[j] = static_cast<float>((2 * rng.NextDouble() - 1) * bound);
        break;
      }
    }
  }
  std::vector<float> hb(static_cast<size_t>(buffers_.numel()), 0.f);
  for (size_t i = 0; i < buffer_refs_.size(); ++i) {
    if (buffer_refs_[i].init == Init::kOnes) {
      float* p = hb.data() + named_buffers_[i].offset;
      std::fill(p, p + buffer_refs_[i].shape.numel(), 1.f);
    }
  }
  // An imported model's own weights replace the initialisation above, tensor by tensor.
  const auto& initial = net_->initial_values();
  size_t used = 0;
  const auto take = [&](const NamedTensor& t, std::vector<float>* host_buf) {
    const auto it = initial.find(t.name);
    if (it == initial.end()) return;
    DPT_CHECK_AS(ConfigError, static_cast<int64_t>(it->second.size()) == t.tensor.numel())
        << net_->origin() << ": initializer '" << t.name << "' has " << it->second.size()
        << " values but the layer needs " << t.tensor.shape().ToString() << " = "
        << t.tensor.numel();
    std::copy(it->second.begin(), it->second.end(), host_buf->begin() + t.offset);
    ++used;
  };
  for (const auto& t : named_params_) take(t, &host);
  for (const auto& t : named_buffers_) take(t, &hb);
  DPT_CHECK(used == initial.size()) << net_->origin() << ": " << initial.size() - used
                                    << " starting values name no parameter or buffer";
  backend_.CopyFromHost(host.data(), &params_);
  backend_.CopyFromHost(hb.data(), &buffers_);
  if (grads_.defined()) backend_.Zero(&grads_);
}

const Tensor& Model::Forward(const Tensor& x, const ForwardContext& ctx) {
  return net_->Forward(x, ctx);
}

void Model::Backward(const Tensor& dout, bool accumulate,
                     const std::function<void(int64_t)>& on_ready,
                     const std::function<void(size_t)>& on_child) {
  net_->BackwardEach(
      dout, accumulate,
      [&](size_t child) {
        if (on_child) on_child(child);
      },
      [&](size_t child) {
        if (on_ready) on_ready(ready_after_child_[child]);
      });
  if (on_ready) on_ready(flat_floats_);
}

void Model::BindGroupGrads(size_t g, const Tensor& grads) {
  DPT_CHECK(g < groups_.size()) << "gradient group " << g << " of " << groups_.size();
  const int64_t begin = groups_[g].first;
  DPT_CHECK(!grads.defined() || grads.numel() == groups_[g].second - begin)
      << "gradient group " << g << ": " << grads.numel() << " floats for "
      << groups_[g].second - begin;
  for (size_t i : group_params_[g]) {
    const auto& r = param_refs_[i];
    *r.grad = grads.defined()
                  ? grads.View(r.shape, static_cast<size_t>(param_offsets_[i] - begin) * 4)
                  : Tensor();
  }
}

int64_t Model::num_params() const {
  int64_t n = 0;
  for (const auto& p : named_params_) n += p.tensor.numel();
  return n;
}

std::string Model::Summary() const {
  std::string s;
  for (const auto& line : summary_) s += line + "\n";
  return s;
}

}  // namespace dptrain
