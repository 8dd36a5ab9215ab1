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
    // Not the last node: the model's output stays a tensor that backward leaves alone (a folded
    // producer gates its gradient over its own output).
    if (!fold_ || n.inputs.size() != 1 || n.inputs[0] == kInput || &n == &nodes_.back()) continue;
    Node& producer = nodes_[static_cast<size_t>(n.inputs[0])];
    if (producer.readers == 1) n.layer->FoldIntoInput(*producer.layer);
  }
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
    o.need_dx = opts.need_dx || !reads_graph_input_only;
    // Out-of-memory reports name the node whose buffers were being allocated.
    const AllocationScope scope(what);
    n.shape = n.layer->SetupInputs(shapes, o);
    if (n.readers > 1) n.grad_sum = backend_.Empty(n.shape, DType::kF32, what + " gradient sum");
  }
  return nodes_.back().shape;
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
