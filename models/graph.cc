// SPDX-License-Identifier: Apache-2.0
// Graph: node order, setup with fan-out counting, forward, and the reverse pass that sums the
// gradients of outputs read by several nodes.
#include "models/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "core/error.h"
#include "core/memory/caching_allocator.h"

namespace dptrain {
namespace {

// A buffer of `bytes` read from the forward or backward of node `first` to that of node `last`.
struct Span {
  size_t first = 0, last = 0, bytes = 0;
};

// Cuts nodes [0, count) into segments of consecutive nodes (seg[i]: node i's) for activation
// recompute. A span inside a segment lives in that segment's part of a shared buffer; one a cut
// crosses is kept. For a cap on a segment's part, the cut that keeps the fewest bytes is a
// shortest path over segment boundaries (a segment [j, i) adds the spans that start in it and end
// after it); over caps from all the bytes down by factors of 2^(1/8), the cut of the least
// cost(seg) (kept plus the largest part) wins, and of equal ones the one found first. Time
// about caps x nodes x segment length; memory linear in the nodes.
std::vector<size_t> CheapestCut(const std::vector<Span>& spans, size_t count,
                                const std::function<size_t(const std::vector<size_t>&)>& cost) {
  std::vector<std::vector<const Span*>> ending(count);
  std::vector<size_t> starting(count, 0);
  size_t total = 0;
  for (const Span& s : spans) {
    ending[s.last].push_back(&s);
    starting[s.first] += s.bytes;
    total += s.bytes;
  }
  std::vector<size_t> best(count, 0);  // one segment
  size_t best_cost = cost(best);
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> seg(count), kept(count + 1), from(count + 1);
  size_t last_cap = kNone;
  for (int k = 1; k <= 128; ++k) {
    const auto cap = static_cast<size_t>(static_cast<double>(total) * std::exp2(-k / 8.0));
    if (cap == 0) break;
    if (cap == last_cap) continue;
    last_cap = cap;
    std::fill(kept.begin(), kept.end(), kNone);
    kept[0] = 0;
    for (size_t j = 0; j < count; ++j) {
      if (kept[j] == kNone) continue;
      size_t inside = 0, started = 0;  // of the spans that start in [j, i)
      for (size_t i = j + 1; i <= count; ++i) {
        started += starting[i - 1];
        for (const Span* s : ending[i - 1]) inside += s->first >= j ? s->bytes : 0;
        if (inside > cap) break;  // only grows with i
        const size_t v = kept[j] + (started - inside);
        if (v < kept[i]) {
          kept[i] = v;
          from[i] = j;
        }
      }
    }
    if (kept[count] == kNone) continue;
    std::vector<size_t> starts;  // of the segments, last first
    for (size_t i = count; i > 0; i = from[i]) starts.push_back(from[i]);
    for (size_t t = starts.size(); t-- > 0;) {
      const size_t end = t > 0 ? starts[t - 1] : count;
      for (size_t i = starts[t]; i < end; ++i) seg[i] = starts.size() - 1 - t;
    }
    const size_t v = cost(seg);
    if (v < best_cost) {
      best_cost = v;
      best = seg;
    }
  }
  return best;
}

}  // namespace

int Graph::Add(std::unique_ptr<Layer> layer, std::vector<int> inputs, std::string node_name) {
  const int index = static_cast<int>(nodes_.size());
  if (inputs.empty()) inputs.push_back(index - 1);  // the previous node, or kInput for the first
  for (int j : inputs) {
    DPT_CHECK(j >= kInput && j < index)
        << "graph node " << index << " reads node " << j << ", which is not an earlier node";
  }
  Node n;
  if (node_name.empty()) node_name = layer->name().empty() ? "" : layer->name();
  n.name = std::move(node_name);
  n.layer = std::move(layer);
  n.label = n.name.empty() ? n.layer->type() + " #" + std::to_string(index) : n.name;
  n.inputs = std::move(inputs);
  nodes_.push_back(std::move(n));
  return index;
}

void Graph::SetInitialValue(const std::string& name, std::vector<float> values) {
  initial_[name] = std::move(values);
}

Shape Graph::Setup(const Shape& in, const SetupOptions& opts) {
  DPT_CHECK_AS(ConfigError, !nodes_.empty()) << "the model has no layers";
  for (auto& n : nodes_) n.readers = 0;
  for (auto& n : nodes_) {
    for (int j : n.inputs) {
      if (j != kInput) ++nodes_[static_cast<size_t>(j)].readers;
    }
  }
  ++nodes_.back().readers;
  passes_ = std::make_unique<GraphPasses>(*this, backend_);
  passes_->Fuse(fold_);
  std::vector<char> refused(nodes_.size(), 0);
  grad_arena_ = out_arena_ = Tensor();
  slot_buffers_.clear();
  out_slot_buffers_.clear();
  recompute_from_.clear();
  segments_ = 1;
  fwd_x_ = Tensor();
  for (;;) {
    const std::vector<char> nhwc = passes_->PlanLayouts(channels_last_, &refused);
    for (size_t i = 0; i < nodes_.size(); ++i) nodes_[i].nhwc = nhwc[i] != 0;
    size_t failed = 0;
    try {
      SetupNodes(in, opts, &failed);
      break;
    } catch (const NhwcRefused&) {
      DPT_CHECK(!refused[failed]) << "graph node " << failed << " refused NCHW inputs";
      refused[failed] = 1;  // and set every node up again: its inputs' layouts change
      // Plans made for the layouts given up on would stay cached (with their buffers).
      backend_.ReleasePlans();
    }
  }
  setup_batch_ = in[0];
  PlaceInputGrads(in[0]);
  PlanRecompute(in[0]);
  return nodes_.back().shape;
}

void Graph::SetupNodes(const Shape& in, const SetupOptions& opts, size_t* failed) {
  std::vector<Shape> shapes;
  grad_slots_.clear();
  out_slots_.clear();
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    const std::string what = n.name.empty() ? n.layer->type() + " #" + std::to_string(i) : n.name;
    DPT_CHECK_AS(ConfigError, n.readers > 0)
        << "layer '" << what << "': no layer reads its output and it is not the last layer "
        << "(name it in a later layer's inputs, or remove it)";
    shapes.clear();
    bool reads_graph_input_only = true;
    for (int j : n.inputs) {
      shapes.push_back(j == kInput ? in : nodes_[static_cast<size_t>(j)].shape);
      reads_graph_input_only = reads_graph_input_only && j == kInput;
    }
    SetupOptions o = opts;
    o.nhwc_in = !n.inputs.empty();
    for (int j : n.inputs)
      o.nhwc_in = o.nhwc_in && j != kInput && nodes_[static_cast<size_t>(j)].nhwc;
    o.nhwc_out = n.nhwc;
    o.need_dx = opts.need_dx || !reads_graph_input_only;
    o.fuse_conv_pool = opts.fuse_conv_pool && fuse_conv_pool_;
    if (share_input_grads_) {
      o.input_grad = [this, i](size_t input, const Shape& shape, DType dtype,
                               const std::string& label) {
        Tensor t = UnboundTensor(shape, dtype, label);
        grad_slots_.push_back({i, input, t.buffer()});
        return t;
      };
    }
    o.recompute = recompute_;
    if (recompute_) {
      o.forward_buffer = [this, i](const Shape& shape, DType dtype, const std::string& label,
                                   bool output) {
        Tensor t = UnboundTensor(shape, dtype, label);
        out_slots_.push_back({i, output, t.buffer()});
        return t;
      };
    }
    // A strided shortcut may hand its input gradient sampled to the sum that adds it as it reads
    // it (one reader of the input's two).
    Node* from = n.inputs.size() == 1 && n.inputs[0] != kInput
                     ? &nodes_[static_cast<size_t>(n.inputs[0])]
                     : nullptr;
    o.sampled_input_grad = from != nullptr && from->sums_sampled && from->sampled_reader == kNoNode;
    // Out-of-memory reports name the node whose buffers were being allocated.
    const AllocationScope scope(what);
    *failed = i;
    passes_->Choose(i, shapes, &n.nhwc, &o);  // the node's descriptor, for its shapes
    n.shape = n.layer->SetupInputs(shapes, o);
    n.grad_sum = Tensor();
    size_t summed_at = 0;
    n.sums_parts = sum_gradient_parts_ && n.readers == 2 && i + 1 < nodes_.size() &&
                   SumsPartsFrom(i, &summed_at);
    n.sums_sampled = n.sums_parts && nodes_[summed_at].layer->flow().sums_sampled_part;
    n.sampled_reader = kNoNode;  // its readers, set up next, may take it
    if (n.layer->flow().input_grad_stride != 1) {
      DPT_CHECK(o.sampled_input_grad)
          << "layer '" << what << "' hands its input gradient sampled without the graph's offer";
      from->sampled_reader = i;
    }
    n.grad_sum_shared = n.readers > 1 && !n.sums_parts && share_input_grads_;
    if (n.grad_sum_shared) {  // placed with the input gradients
      n.grad_sum = UnboundTensor(n.shape, DType::kF32, what + " gradient sum");
    } else if (n.readers > 1 && !n.sums_parts) {
      n.grad_sum = backend_.Empty(n.shape, DType::kF32, what + " gradient sum");
    }
  }
}

bool Graph::SumsPartsFrom(size_t i, size_t* at) const {
  size_t k = i;
  while (nodes_[k].layer->flow().passes_gradient_as_is) {
    // The memory plans keep a passed gradient alive through the layers that say PassesGradient.
    DPT_CHECK(nodes_[k].layer->flow().passes_gradient)
        << "layer '" << nodes_[k].label << "' passes its gradient as it is, but not PassesGradient";
    const std::vector<int>& in = nodes_[k].inputs;
    if (in.size() != 1 || in[0] == kInput) return false;
    k = static_cast<size_t>(in[0]);
    if (nodes_[k].readers != 1) return false;
  }
  *at = k;
  return nodes_[k].layer->flow().sums_gradient_parts;
}

void Graph::PlaceInputGrads(int64_t batch) {
  const size_t count = nodes_.size();
  for (auto& n : nodes_) {
    n.shared_grad_bytes = 0;
    n.input_slots.assign(n.inputs.size(), nullptr);
  }
  // Backward runs node count - 1 first: node j's backward is at step count - 1 - j. last[j]: the
  // last step that may read the gradient of node j's output: j's backward, or that of an input
  // of j's when j may pass the gradient on (LayerFlow::passes_gradient), and so on.
  std::vector<size_t> last(count);
  for (size_t j = 0; j < count; ++j) {
    last[j] = count - 1 - j;
    if (!nodes_[j].layer->flow().passes_gradient) continue;
    for (int p : nodes_[j].inputs) {
      if (p != kInput) last[j] = std::max(last[j], last[static_cast<size_t>(p)]);
    }
  }
  struct Placed {
    std::shared_ptr<Buffer> buffer;
    size_t begin = 0, end = 0;  // backward steps, both included
    size_t offset = 0;
  };
  std::vector<Placed> placed;
  for (const GradSlot& g : grad_slots_) {
    auto b = g.buffer.lock();
    if (b == nullptr || b->bytes() == 0) continue;
    // Written by node g.node's backward; an input gradient of the graph input is never read, but
    // is written, so it lives through that step only. One for every input (kEveryInput) lives
    // until each input's producer is done with it.
    const size_t begin = count - 1 - g.node;
    size_t end = begin;
    const std::vector<int>& inputs = nodes_[g.node].inputs;
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (g.input != kEveryInput && k != g.input) continue;
      if (inputs[k] != kInput) end = std::max(end, last[static_cast<size_t>(inputs[k])]);
      nodes_[g.node].input_slots[k] = b.get();
    }
    placed.push_back({b, begin, end, 0});
    nodes_[g.node].shared_grad_bytes += static_cast<int64_t>(b->bytes());
  }
  // A gradient sum is written from the backward of the output's last reader (the first to run)
  // and read until the output's gradient is: last[j].
  std::vector<size_t> first_step(count, count);
  for (size_t i = 0; i < count; ++i) {
    for (int j : nodes_[i].inputs) {
      if (j != kInput) first_step[static_cast<size_t>(j)] = count - 1 - i;  // i grows: the last
    }
  }
  for (size_t j = 0; j < count; ++j) {
    if (!nodes_[j].grad_sum_shared) continue;
    placed.push_back({nodes_[j].grad_sum.buffer(), std::min(first_step[j], last[j]), last[j], 0});
  }
  // Largest first, each at the lowest offset that no placed buffer alive at the same time covers
  // (aligned for vector loads and the GPU's 256-byte transactions).
  constexpr size_t kAlign = 512;
  std::vector<size_t> order(placed.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return placed[a].buffer->bytes() > placed[b].buffer->bytes();
  });
  size_t total = 0;
  std::vector<std::pair<size_t, size_t>> busy;  // [offset, end) of overlapping placed buffers
  for (size_t k = 0; k < order.size(); ++k) {
    Placed& p = placed[order[k]];
    busy.clear();
    for (size_t q = 0; q < k; ++q) {
      const Placed& o = placed[order[q]];
      if (o.begin <= p.end && p.begin <= o.end)
        busy.emplace_back(o.offset, o.offset + o.buffer->bytes());
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [lo, hi] : busy) {
      if (offset + p.buffer->bytes() <= lo) break;
      offset = std::max(offset, (hi + kAlign - 1) / kAlign * kAlign);
    }
    p.offset = offset;
    total = std::max(total, offset + p.buffer->bytes());
  }
  if (placed.empty()) return;
  const AllocationScope scope("input gradients");
  grad_arena_ = backend_.Empty(
      Shape{static_cast<int64_t>(total)}, DType::kU8,
      fmt::format("input gradients (shared by {} buffers, batch {})", placed.size(), batch));
  for (Placed& p : placed) {
    p.buffer->Bind(grad_arena_.buffer(), p.offset);
    slot_buffers_.insert(p.buffer.get());
  }
}

Tensor Graph::UnboundTensor(const Shape& shape, DType dtype, const std::string& label) const {
  return Tensor(
      Buffer::Unbound(static_cast<size_t>(shape.numel()) * SizeOf(dtype), backend_.device(), label),
      shape, dtype);
}

void Graph::PlanRecompute(int64_t batch) {
  const size_t count = nodes_.size();
  for (auto& n : nodes_) {
    n.shared_out_bytes = 0;
    n.out_slot = nullptr;
  }
  struct Slot {
    std::shared_ptr<Buffer> buffer;
    size_t node = 0;
    size_t bytes = 0;  // aligned, as placed
    size_t last = 0;   // the last node that reads it
    size_t first = 0;  // the first node whose backward reads it (LayerFlow::gradient_in_output)
    bool graph_output = false;
  };
  constexpr size_t kAlign = 512;
  std::vector<Slot> slots;
  std::vector<std::vector<size_t>> alias(count);  // the slots node j's output may be
  for (const OutSlot& o : out_slots_) {
    auto b = o.buffer.lock();
    if (b == nullptr || b->bytes() == 0) continue;
    nodes_[o.node].shared_out_bytes += static_cast<int64_t>(b->bytes());
    if (o.output) {
      nodes_[o.node].out_slot = b.get();
      alias[o.node].push_back(slots.size());
    }
    slots.push_back(
        {b, o.node, (b->bytes() + kAlign - 1) / kAlign * kAlign, o.node, o.node, false});
  }
  if (slots.empty()) return;
  // A layer that may return its input has its readers read the input's buffer (Forward checks).
  for (size_t j = 0; j < count; ++j) {
    if (!nodes_[j].layer->flow().forward_passes_input) continue;
    for (int p : nodes_[j].inputs) {
      if (p != kInput) {
        const auto& a = alias[static_cast<size_t>(p)];
        alias[j].insert(alias[j].end(), a.begin(), a.end());
      }
    }
  }
  for (size_t i = 0; i < count; ++i) {
    for (int p : nodes_[i].inputs) {
      if (p == kInput) continue;
      for (size_t k : alias[static_cast<size_t>(p)]) slots[k].last = std::max(slots[k].last, i);
    }
  }
  for (size_t k : alias[count - 1]) slots[k].graph_output = true;
  // A layer that hands its inputs a gradient in its output buffer: that is read by the backward of
  // the inputs' producers (and of theirs, through layers that pass a gradient on).
  for (size_t k = 0; k < slots.size(); ++k) {
    const size_t j = slots[k].node;
    if (nodes_[j].out_slot != slots[k].buffer.get() || !nodes_[j].layer->flow().gradient_in_output)
      continue;
    std::vector<int> todo = nodes_[j].inputs;
    while (!todo.empty()) {
      const int p = todo.back();
      todo.pop_back();
      if (p == kInput) continue;
      const Node& pn = nodes_[static_cast<size_t>(p)];
      slots[k].first = std::min(slots[k].first, static_cast<size_t>(p));
      if (pn.layer->flow().passes_gradient)
        todo.insert(todo.end(), pn.inputs.begin(), pn.inputs.end());
    }
  }
  const auto kept_in = [&](const Slot& s, const std::vector<size_t>& seg) {
    return s.graph_output || seg[s.last] != seg[s.node] || seg[s.first] != seg[s.node];
  };

  // A cut: seg[i] = node i's segment, nondecreasing. A slot whose readers are all in its own
  // segment lives in that segment's part of the shared buffer; any other is kept. Cost: the kept
  // slots plus the largest segment.
  const auto cost = [&](const std::vector<size_t>& seg) {
    size_t kept = 0;
    std::vector<size_t> part(seg.back() + 1, 0);
    for (const Slot& s : slots) {
      if (kept_in(s, seg)) {
        kept += s.bytes;
      } else {
        part[seg[s.node]] += s.bytes;
      }
    }
    return kept + *std::max_element(part.begin(), part.end());
  };
  std::vector<size_t> best(count, 0);  // one segment: nothing runs again
  if (segment_nodes_ > 0) {
    for (size_t i = 0; i < count; ++i) best[i] = i / segment_nodes_;
  } else {
    std::vector<Span> spans;
    for (const Slot& s : slots) {
      if (!s.graph_output) spans.push_back({s.first, s.last, s.bytes});
    }
    best = CheapestCut(spans, count, cost);
  }
  segments_ = best.back() + 1;
  // Kept slots first, then each segment's from the same offset.
  size_t kept = 0;
  std::vector<size_t> offset(slots.size(), 0);
  for (size_t k = 0; k < slots.size(); ++k) {
    if (kept_in(slots[k], best)) {
      offset[k] = kept;
      kept += slots[k].bytes;
    }
  }
  std::vector<size_t> part(segments_, kept);
  size_t total = kept;
  for (size_t k = 0; k < slots.size(); ++k) {
    if (kept_in(slots[k], best)) continue;
    size_t& at = part[best[slots[k].node]];
    offset[k] = at;
    at += slots[k].bytes;
    total = std::max(total, at);
  }
  {
    const AllocationScope scope("activations");
    out_arena_ = backend_.Empty(
        Shape{static_cast<int64_t>(total)}, DType::kU8,
        fmt::format("activations (recomputed in {} segments, batch {})", segments_, batch));
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    slots[k].buffer->Bind(out_arena_.buffer(), offset[k]);
    out_slot_buffers_.insert(slots[k].buffer.get());
  }
  if (segments_ < 2) return;
  recompute_from_.assign(count, kNoRecompute);
  size_t first = 0;
  for (size_t i = 0; i + 1 < count; ++i) {
    if (best[i + 1] == best[i]) continue;
    recompute_from_[i] = first;  // segment best[i] ends at node i
    first = i + 1;
  }
}

void Graph::ForwardNode(size_t i, const Tensor& x, const ForwardContext& ctx) {
  Node& n = nodes_[i];
  xs_.clear();
  for (int j : n.inputs) xs_.push_back(j == kInput ? &x : nodes_[static_cast<size_t>(j)].out);
  backend_.SetProfileNode(&n.label);
  n.out = &n.layer->ForwardInputs(xs_, ctx);
  // A shared buffer's lifetime was planned for the node's own output, or for an input's buffer
  // when the layer passes its input on.
  const Buffer* b = n.out->buffer().get();
  if (b != n.out_slot && out_slot_buffers_.count(b) != 0) {
    bool passed = false;
    for (const Tensor* in : xs_) passed = passed || in->buffer().get() == b;
    DPT_CHECK(passed && n.layer->flow().forward_passes_input)
        << "layer '" << n.label << "' returned its output in a shared buffer not planned for it ('"
        << b->label() << "')";
  }
}

const Tensor& Graph::Forward(const Tensor& x, const ForwardContext& ctx) {
  fwd_x_ = Tensor();
  fwd_ctx_ = ctx;
  if (!recompute_from_.empty() && ctx.training) {
    fwd_x_ = x;
    fwd_ctx_.recompute = true;
  }
  for (size_t i = 0; i < nodes_.size(); ++i) ForwardNode(i, x, ctx);
  backend_.SetProfileNode(nullptr);
  return *nodes_.back().out;
}

void Graph::Recompute(size_t last) {
  DPT_CHECK(fwd_ctx_.recompute && fwd_x_.defined())
      << "graph backward without a training forward to recompute activations from";
  const size_t first = recompute_from_[last];
  for (size_t i = first; i <= last; ++i) ForwardNode(i, fwd_x_, fwd_ctx_);
  backend_.SetProfileNode(nullptr);
  if (first == 0) fwd_x_ = Tensor();  // the last segment to run again: let the batch go
}

void Graph::StartBackward(const Tensor& dy) {
  for (auto& n : nodes_) {
    n.grad = n.grad2 = nullptr;
    n.grad_stride = n.grad2_stride = 1;
  }
  nodes_.back().grad = &dy;
}

void Graph::BackwardNode(size_t i, bool accumulate) {
  Node& n = nodes_[i];
  DPT_CHECK(n.grad != nullptr) << "graph node " << i << " has no gradient";
  DPT_CHECK(n.grad_stride == 1) << "graph node " << i << " has only a sampled gradient part";
  if (n.grad2 != nullptr && n.layer->flow().passes_gradient_as_is) {
    // Both parts go on as they are to the one input (SumsPartsFrom), its only reader this node.
    Node& p = nodes_[static_cast<size_t>(n.inputs[0])];
    DPT_CHECK(p.grad == nullptr) << "graph node " << i << " hands on a gradient in two parts";
    p.grad = n.grad;
    p.grad2 = n.grad2;
    p.grad2_stride = n.grad2_stride;
    return;
  }
  backend_.SetProfileNode(&n.label);
  if (n.grad2 != nullptr) {
    n.layer->BackwardInputsSum(*n.grad, *n.grad2, n.grad2_stride, accumulate, &dxs_);
  } else {
    n.layer->BackwardInputs(*n.grad, accumulate, &dxs_);
  }
  DPT_CHECK(dxs_.size() == n.inputs.size())
      << "layer '" << n.layer->label() << "' returned " << dxs_.size() << " gradients for "
      << n.inputs.size() << " inputs";
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    if (n.inputs[k] == kInput) continue;
    // A shared buffer's lifetime was planned for the gradient its layer asked it for, or for the
    // gradient the layer was given when it passes that on.
    const Buffer* b = dxs_[k]->buffer().get();
    if (slot_buffers_.count(b) != 0) {
      const bool own = k < n.input_slots.size() && n.input_slots[k] == b;
      const bool passed = n.layer->flow().passes_gradient && n.grad->buffer().get() == b;
      DPT_CHECK(own || passed) << "layer '" << n.label << "' returned the gradient of input " << k
                               << " in a shared buffer not planned for it ('" << b->label() << "')";
    }
    // An activation buffer holds a gradient only where its layer declared so (GradientInOutput),
    // and from there through the layers that pass it on.
    if (out_slot_buffers_.count(b) != 0) {
      const bool own = b == n.out_slot && n.layer->flow().gradient_in_output;
      const bool passed = n.layer->flow().passes_gradient && n.grad->buffer().get() == b;
      DPT_CHECK(own || passed) << "layer '" << n.label << "' returned the gradient of input " << k
                               << " in an activation buffer not planned for it ('" << b->label()
                               << "')";
    }
    const size_t j = static_cast<size_t>(n.inputs[k]);
    AddGradient(n.inputs[k], *dxs_[k],
                nodes_[j].sampled_reader == i ? n.layer->flow().input_grad_stride : 1);
  }
  backend_.SetProfileNode(nullptr);
}

void Graph::AddGradient(int j, const Tensor& g, int64_t stride) {
  Node& n = nodes_[static_cast<size_t>(j)];
  if (n.grad == nullptr) {  // the first (often the only) reader: use its tensor as it is
    n.grad = &g;
    n.grad_stride = stride;
    return;
  }
  if (n.sums_parts) {  // the second of two: summed by the backward that reads them
    DPT_CHECK(n.grad2 == nullptr) << "graph node " << j << ": a third gradient part";
    DPT_CHECK(stride == 1 || n.grad_stride == 1) << "graph node " << j << ": two sampled parts";
    n.grad2 = &g;
    n.grad2_stride = stride;
    if (n.grad_stride != 1) {  // the sampled part second (a sum of two floats is either way)
      std::swap(n.grad, n.grad2);
      std::swap(n.grad_stride, n.grad2_stride);
    }
    return;
  }
  DPT_CHECK(stride == 1) << "graph node " << j << ": a sampled gradient to sum into a buffer";
  // Readers run last to first, so the sum is taken in that order (fixed: bitwise reproducible).
  if (n.grad != &n.grad_view) {
    n.grad_view = n.grad_sum.Batch(g.shape()[0]);
    backend_.Add(*n.grad, g, &n.grad_view);
    n.grad = &n.grad_view;
  } else {
    backend_.Add(n.grad_view, g, &n.grad_view);
  }
}

int64_t Graph::GradSumBytesPerSample(size_t i) const {
  const Node& n = nodes_[i];
  if (!n.grad_sum.defined() || n.grad_sum_shared) return 0;  // in InputGradBytesPerSample
  return 4 * n.shape.numel() / n.shape[0];
}

int64_t Graph::SharedInputGradBytesPerSample(size_t i) const {
  return setup_batch_ > 0 ? nodes_[i].shared_grad_bytes / setup_batch_ : 0;
}

int64_t Graph::InputGradBytesPerSample() const {
  if (!grad_arena_.defined() || setup_batch_ <= 0) return 0;
  return (static_cast<int64_t>(grad_arena_.bytes()) + setup_batch_ - 1) / setup_batch_;
}

int64_t Graph::SharedOutputBytesPerSample(size_t i) const {
  return setup_batch_ > 0 ? nodes_[i].shared_out_bytes / setup_batch_ : 0;
}

int64_t Graph::OutputBytesPerSample() const {
  if (!out_arena_.defined() || setup_batch_ <= 0) return 0;
  return (static_cast<int64_t>(out_arena_.bytes()) + setup_batch_ - 1) / setup_batch_;
}

int64_t Graph::OwnBytesPerSample(size_t i) const {
  return nodes_[i].layer->ActivationBytesPerSample() - SharedInputGradBytesPerSample(i) -
         SharedOutputBytesPerSample(i) + GradSumBytesPerSample(i);
}

int64_t Graph::ActivationBytesPerSample() const {
  int64_t total = InputGradBytesPerSample() + OutputBytesPerSample();
  for (size_t i = 0; i < nodes_.size(); ++i) total += OwnBytesPerSample(i);
  return total;
}

Tensor InputGradBuffer(Backend& backend, const SetupOptions& opts, size_t input, const Shape& shape,
                       DType dtype, const std::string& label) {
  if (opts.input_grad) return opts.input_grad(input, shape, dtype, label);
  return backend.Empty(shape, dtype, label);
}

Tensor OutputBuffer(Backend& backend, const SetupOptions& opts, const Shape& shape, DType dtype,
                    const std::string& label) {
  if (opts.forward_buffer) return opts.forward_buffer(shape, dtype, label, true);
  return backend.Empty(shape, dtype, label);
}

Tensor SavedBuffer(Backend& backend, const SetupOptions& opts, const Shape& shape, DType dtype,
                   const std::string& label) {
  if (opts.forward_buffer) return opts.forward_buffer(shape, dtype, label, false);
  return backend.Empty(shape, dtype, label);
}

}  // namespace dptrain
