// SPDX-License-Identifier: Apache-2.0
// Graph: node order, setup with fan-out counting, forward, and the reverse pass that sums the
// gradients of outputs read by several nodes.
#include "models/graph.h"

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
    // Out-of-memory reports name the node whose buffers were being allocated.
    const AllocationScope scope(what);
    *failed = i;
    n.shape = n.layer->SetupInputs(shapes, o);
    if (n.readers > 1) n.grad_sum = backend_.Empty(n.shape, DType::kF32, what + " gradient sum");
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
    if (n.inputs[k] != kInput) AddGradient(n.inputs[k], *dxs_[k]);
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
  return n.grad_sum.defined() ? 4 * n.shape.numel() / n.shape[0] : 0;
}

int64_t Graph::ActivationBytesPerSample() const {
  int64_t total = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    total += nodes_[i].layer->ActivationBytesPerSample() + GradSumBytesPerSample(i);
  }
  return total;
}

}  // namespace dptrain
