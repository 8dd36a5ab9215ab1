// SPDX-License-Identifier: Apache-2.0
// A model: a Graph of layers plus one flat parameter buffer, one flat gradient buffer and one
// flat buffer of non-trainable state (batch-norm running statistics). Every parameter tensor is
// a view into the flat buffers. Parameters are laid out in REVERSE forward order, so the
// gradients that backward produces first (the last layers) are contiguous at the start of the
// gradient buffer: after each top-level layer's backward, grads[0, ready) are final, which is
// what the gradient reducer's buckets need.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/graph.h"

namespace dptrain {

struct NamedTensor {
  std::string name;    // canonical, e.g. "conv1.weight" (no wrapper prefix, ever)
  Tensor tensor;       // view into the flat buffer
  int64_t offset = 0;  // in elements within the flat buffer
};

// How Setup lays out the flat parameter (and gradient) buffer. By default as one run of
// aligned tensors. For sharded data parallelism (dist.shard, runtime/optim/shard_layout.h) it is
// cut into groups of consecutive graph nodes, in backward order: a group closes at the
// first node boundary where it holds at least `group_floats` (the first group:
// `first_group_floats`, so communication starts early) and is padded to a multiple of
// `group_multiple` floats. Without `flat_grads` there is no flat gradient buffer: gradients
// live wherever BindGroupGrads points them.
struct FlatLayout {
  int64_t group_multiple = 0;  // 0: no groups
  int64_t first_group_floats = 0, group_floats = 0;
  bool flat_grads = true;
  // With groups: the most floats a group of several nodes may hold, given the whole layout's
  // floats; a group closes before a node that would take it past that (a node larger than it
  // is a group of its own). Unset: no cap.
  std::function<int64_t(int64_t total_floats)> group_cap;
  // Without flat_grads: asked once the groups are known; true keeps the flat gradient buffer
  // after all, and lays the groups out again without group_cap (dist.shard = "gradients"
  // where its scratch would cost more than it saves runs as "optimizer").
  std::function<bool(const std::vector<std::pair<int64_t, int64_t>>& groups)> keep_flat_grads;
};

class Model {
 public:
  // input_shape: one sample, e.g. (1, 28, 28) or (10).
  Model(Backend& be, std::unique_ptr<Graph> net, Shape input_shape);

  // Sets up every layer for batches of up to max_batch and allocates the flat buffers.
  void Setup(int64_t max_batch, Precision precision, const FlatLayout& layout = {});
  // Deterministic PyTorch-style initialisation from `seed` (same on every rank).
  void InitParams(uint64_t seed);

  // x: (n, input_shape...) on the backend's device. Returns the output (logits / predictions),
  // valid until the next Forward or Backward: layers write gradients over their own outputs in
  // backward, and a model that ends in a view (a flatten after a pool) returns that layer's.
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx);
  // Backward from d(loss)/d(output). Gradients are written into grads() (added when
  // accumulate). `on_ready(n)` is called as backward proceeds: the first n floats of grads() are
  // final. Called with n == grads().numel() at the end.
  // `on_child(c)`, when given, runs before graph node c's backward (BindGroupGrads).
  void Backward(const Tensor& dout, bool accumulate,
                const std::function<void(int64_t)>& on_ready = nullptr,
                const std::function<void(size_t)>& on_child = nullptr);

  // With FlatLayout groups: [begin, end) of each group in the flat buffer, in backward order,
  // covering it; and the group holding graph node c's parameters (-1: none).
  const std::vector<std::pair<int64_t, int64_t>>& groups() const { return groups_; }
  int group_of_child(size_t c) const { return group_of_child_[c]; }
  // Points the gradients of group g's parameters into `grads` (its length, the group's layout;
  // an undefined tensor unbinds them).
  void BindGroupGrads(size_t g, const Tensor& grads);

  Backend& backend() { return backend_; }
  const Shape& input_shape() const { return input_shape_; }
  const Shape& output_shape() const { return output_shape_; }  // with the max batch
  int64_t max_batch() const { return max_batch_; }
  Tensor& params() { return params_; }
  Tensor& grads() { return grads_; }  // undefined without FlatLayout::flat_grads
  Tensor& buffers() { return buffers_; }
  const std::vector<NamedTensor>& named_params() const { return named_params_; }
  const std::vector<NamedTensor>& named_buffers() const { return named_buffers_; }
  const std::vector<NamedTensor>& named_grads() const { return named_grads_; }
  int64_t num_params() const;  // real elements, without alignment padding
  Graph& net() { return *net_; }
  // One line per layer: name, type, output shape, parameters.
  std::string Summary() const;

 private:
  Backend& backend_;
  std::unique_ptr<Graph> net_;
  Shape input_shape_, output_shape_;
  int64_t max_batch_ = 0;
  Tensor params_, grads_, buffers_;
  std::vector<NamedTensor> named_params_, named_grads_, named_buffers_;
  std::vector<ParamRef> param_refs_, buffer_refs_;
  // For each graph node, the number of grad floats final once its backward has run.
  std::vector<int64_t> ready_after_child_;
  int64_t flat_floats_ = 0;
  std::vector<int64_t> param_offsets_;               // of param_refs_ in the flat buffer
  std::vector<std::pair<int64_t, int64_t>> groups_;  // FlatLayout groups
  std::vector<int> group_of_child_;                  // per graph node
  std::vector<std::vector<size_t>> group_params_;    // param_refs_ indices per group
  std::vector<std::string> summary_;
};

}  // namespace dptrain
