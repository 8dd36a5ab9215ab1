// SPDX-License-Identifier: Apache-2.0
// Graph: node order, setup with fan-out counting, forward, and the reverse pass that sums the
// gradients of outputs read by several nodes.
#include "models/graph.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/memory/caching_allocator.h"

namespace dptrain {

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
  for (auto& n : nodes_) {
    // Not the last node: the model's output is not a folded producer's, which gates its
    // gradient over its own output (a view of one, through a flatten at the end, still is:
    // Model::Forward's output is read before Backward).
    if (!fold_ || n.inputs.size() != 1 || n.inputs[0] == kInput || &n == &nodes_.back()) continue;
    Node& producer = nodes_[static_cast<size_t>(n.inputs[0])];
    if (producer.readers == 1) n.layer->FoldIntoInput(*producer.layer);
  }
  std::vector<char> refused(nodes_.size(), 0);
  grad_arena_ = Tensor();
  slot_buffers_.clear();
  for (;;) {
    PlanLayouts(&refused);
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
  return nodes_.back().shape;
}

void Graph::PlanLayouts(std::vector<char>* refused) {
  const size_t count = nodes_.size();
  for (auto& n : nodes_) n.nhwc = false;
  if (!channels_last_ || !backend_.PrefersChannelsLast()) return;
  std::vector<std::vector<size_t>> readers(count);
  for (size_t i = 0; i < count; ++i) {
    for (int j : nodes_[i].inputs) {
      if (j != kInput) readers[static_cast<size_t>(j)].push_back(i);
    }
  }
  const auto takes = [&](size_t i) { return !(*refused)[i] && nodes_[i].layer->TakesNhwc(); };
  const auto chooses = [&](size_t i) { return nodes_[i].layer->ChoosesNhwcOut(); };
  for (;;) {
    // ok[i]: node i's output may be NHWC: not the graph's output, and every reader takes NHWC
    // and, unless it chooses its own output's layout, may write NHWC itself.
    std::vector<char> ok(count, 0);
    for (size_t i = count - 1; i-- > 0;) {
      bool all = true;
      for (size_t r : readers[i]) all = all && takes(r) && (chooses(r) || ok[r]);
      ok[i] = all ? 1 : 0;
    }
    // In node order: a chooser writes NHWC where it may; a taker follows its inputs, which must
    // agree (else it is refused, and the plan made again).
    bool mixed = false;
    for (size_t i = 0; i < count && !mixed; ++i) {
      Node& n = nodes_[i];
      if (chooses(i)) {
        n.nhwc = ok[i] != 0;
        continue;
      }
      size_t nhwc_inputs = 0;
      for (int j : n.inputs) nhwc_inputs += j != kInput && nodes_[static_cast<size_t>(j)].nhwc;
      n.nhwc = nhwc_inputs > 0;
      if (nhwc_inputs > 0 && nhwc_inputs < n.inputs.size()) {
        (*refused)[i] = 1;
        mixed = true;
      }
    }
    if (!mixed) return;
    for (auto& n : nodes_) n.nhwc = false;
  }
}

void Graph::SetupNodes(const Shape& in, const SetupOptions& opts, size_t* failed) {
  std::vector<Shape> shapes;
  grad_slots_.clear();
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
        auto buffer = Buffer::Unbound(static_cast<size_t>(shape.numel()) * SizeOf(dtype),
                                      backend_.device(), label);
        grad_slots_.push_back({i, input, buffer});
        return Tensor(buffer, shape, dtype);
      };
    }
    // Out-of-memory reports name the node whose buffers were being allocated.
    const AllocationScope scope(what);
    *failed = i;
    n.shape = n.layer->SetupInputs(shapes, o);
    n.grad_sum = Tensor();
    n.grad_sum_shared = n.readers > 1 && share_input_grads_;
    if (n.grad_sum_shared) {  // placed with the input gradients
      n.grad_sum = Tensor(Buffer::Unbound(static_cast<size_t>(n.shape.numel()) * 4,
                                          backend_.device(), what + " gradient sum"),
                          n.shape, DType::kF32);
    } else if (n.readers > 1) {
      n.grad_sum = backend_.Empty(n.shape, DType::kF32, what + " gradient sum");
    }
  }
}

void Graph::PlaceInputGrads(int64_t batch) {
  const size_t count = nodes_.size();
  for (auto& n : nodes_) {
    n.shared_grad_bytes = 0;
    n.input_slots.assign(n.inputs.size(), nullptr);
  }
  // Backward runs node count - 1 first: node j's backward is at step count - 1 - j. last[j]: the
  // last step that may read the gradient of node j's output: j's backward, or that of an input
  // of j's when j may pass the gradient on (Layer::PassesGradient), and so on.
  std::vector<size_t> last(count);
  for (size_t j = 0; j < count; ++j) {
    last[j] = count - 1 - j;
    if (!nodes_[j].layer->PassesGradient()) continue;
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
    const int j = nodes_[g.node].inputs[g.input];
    // Written by node g.node's backward; an input gradient of the graph input is never read, but
    // is written, so it lives through that step only.
    const size_t begin = count - 1 - g.node;
    placed.push_back({b, begin, j == kInput ? begin : last[static_cast<size_t>(j)], 0});
    nodes_[g.node].shared_grad_bytes += static_cast<int64_t>(b->bytes());
    nodes_[g.node].input_slots[g.input] = b.get();
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

const Tensor& Graph::Forward(const Tensor& x, const ForwardContext& ctx) {
  for (auto& n : nodes_) {
    xs_.clear();
    for (int j : n.inputs) xs_.push_back(j == kInput ? &x : nodes_[static_cast<size_t>(j)].out);
    backend_.SetProfileNode(&n.label);
    n.out = &n.layer->ForwardInputs(xs_, ctx);
  }
  backend_.SetProfileNode(nullptr);
  return *nodes_.back().out;
}

void Graph::StartBackward(const Tensor& dy) {
  for (auto& n : nodes_) n.grad = nullptr;
  nodes_.back().grad = &dy;
}

void Graph::BackwardNode(size_t i, bool accumulate) {
  Node& n = nodes_[i];
  DPT_CHECK(n.grad != nullptr) << "graph node " << i << " has no gradient";
  backend_.SetProfileNode(&n.label);
  n.layer->BackwardInputs(*n.grad, accumulate, &dxs_);
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
      const bool passed = n.layer->PassesGradient() && n.grad->buffer().get() == b;
      DPT_CHECK(own || passed) << "layer '" << n.label << "' returned the gradient of input " << k
                               << " in a shared buffer not planned for it ('" << b->label() << "')";
    }
    AddGradient(n.inputs[k], *dxs_[k]);
  }
  backend_.SetProfileNode(nullptr);
}

void Graph::AddGradient(int j, const Tensor& g) {
  Node& n = nodes_[static_cast<size_t>(j)];
  if (n.grad == nullptr) {  // the first (often the only) reader: use its tensor as it is
    n.grad = &g;
    return;
  }
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

int64_t Graph::ActivationBytesPerSample() const {
  int64_t total = InputGradBytesPerSample();
  for (size_t i = 0; i < nodes_.size(); ++i) {
    total += nodes_[i].layer->ActivationBytesPerSample() - SharedInputGradBytesPerSample(i) +
             GradSumBytesPerSample(i);
  }
  return total;
}

Tensor InputGradBuffer(Backend& backend, const SetupOptions& opts, size_t input, const Shape& shape,
                       DType dtype, const std::string& label) {
  if (opts.input_grad) return opts.input_grad(input, shape, dtype, label);
  return backend.Empty(shape, dtype, label);
}

}  // namespace dptrain
