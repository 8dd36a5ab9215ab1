// SPDX-License-Identifier: Apache-2.0
// Graph: a model's network as a directed acyclic graph of layers over their outputs. Every front
// end builds one: the zoo (C++), model.layers (TOML, a chain unless a layer names its `inputs`)
// and model.onnx. Nodes are kept in the order they were added, which is a topological order
// (a node may only read the graph input or earlier nodes); the last node's output is the graph's
// output. Backward runs the nodes in reverse, so after node i's backward every parameter
// gradient of nodes i.. is final: what the Model's gradient buckets rely on.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "models/layer.h"
#include "models/passes/passes.h"

namespace dptrain {

class Graph {
 public:
  static constexpr int kInput = -1;  // the graph's input, as a node's input

  explicit Graph(Backend& be) : backend_(be) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Appends `layer`, reading the outputs of `inputs` (earlier node indices or kInput); with no
  // inputs given, the last node's output (the graph input for the first node). `node_name` names
  // the node in summaries and memory reports (default: the layer's label); the layer's own name
  // is its parameters' prefix ("layer1.0.conv1" gives "layer1.0.conv1.weight"). Returns the
  // node's index. An input that is not an earlier node is an InternalError.
  int Add(std::unique_ptr<Layer> layer, std::vector<int> inputs = {}, std::string node_name = "");

  size_t size() const { return nodes_.size(); }
  Layer& layer(size_t i) const { return *nodes_[i].layer; }
  const std::vector<int>& inputs(size_t i) const { return nodes_[i].inputs; }
  const std::string& node_name(size_t i) const { return nodes_[i].name; }
  // The node's output shape, with the Setup batch (valid after Setup).
  const Shape& output_shape(size_t i) const { return nodes_[i].shape; }

  // Sets every node up for inputs of shape `in` (dimension 0 = the largest batch) and returns
  // the output shape. A node whose output nobody reads (other than the last) is a ConfigError,
  // as are shapes a layer refuses. Out-of-memory reports name the node being set up. The graph's
  // passes (models/passes) decide first what runs where: a ReLU folded into the batch norm,
  // convolution or residual sum whose output only it reads (the same numbers, one pass over the
  // activation instead of two, no ReLU buffers), a residual sum applying the batch norms before
  // it, the channels-last regions; and, as each node is set up, which fused or 16-bit
  // descriptors the backend runs for its shapes.
  Shape Setup(const Shape& in, const SetupOptions& opts);
  // Off: no folding at the next Setup (the tests that prove folding changes no number).
  void set_fold(bool on) { fold_ = on; }
  // Off: a first layer's convolution, ReLU and 2x2 max pool stay two ops where the backend could
  // fuse them (SetupOptions::fuse_conv_pool; with folding on, which the fusion builds on). The
  // fused op sums in another order: the tests that prove folding changes no number turn it off.
  void set_fuse_conv_pool(bool on) { fuse_conv_pool_ = on; }
  // Off: an output's two gradients are summed into a buffer of their own at the next Setup even
  // where the layer reading the sum could add them as it reads (LayerFlow::sums_gradient_parts; the
  // tests that prove taking them in parts changes no number).
  void set_sum_gradient_parts(bool on) { sum_gradient_parts_ = on; }
  // Channels-last activations, on a backend that keeps them (BackendCapabilities::channels_last):
  // Setup plans which outputs are NHWC (the layout pass, models/passes/layout.cc). A node that
  // refuses at Setup (a broadcast add) is planned again on NCHW. Off: every activation NCHW (the
  // tests that prove the layout changes no number beyond rounding).
  void set_channels_last(bool on) { channels_last_ = on; }
  // Whether node i's output is NHWC (valid after Setup).
  bool output_nhwc(size_t i) const { return nodes_[i].nhwc; }
  // Input gradients in one shared buffer: a layer's buffer for an input's gradient is needed from
  // its backward until the backward of the node producing that input (or, through layers that pass
  // a gradient on, an earlier one), and an output's gradient sum from its last reader's backward
  // until then too; buffers whose lifetimes do not overlap share memory. Setup places them
  // (largest first, each at the lowest offset free for its lifetime) in one allocation: about the
  // largest few of them instead of all (resnet8's activations: 1,722 -> 1,098 KiB a sample). The
  // same numbers either way. Off: every layer keeps its own (the tests that count a layer's own
  // bytes).
  void set_share_input_grads(bool on) { share_input_grads_ = on; }
  // Activation recompute (gradient checkpointing, PyTorch's torch.utils.checkpoint): Setup cuts
  // the graph into segments of consecutive nodes. An output read only inside its segment (and a
  // buffer only its layer's backward reads: SavedBuffer) lives in one buffer the segments share;
  // an output read by a later segment, and the graph's output, keep their own place. Before the
  // backward of a segment's last node, the segment's forward runs again (ForwardContext::recompute:
  // batch norm leaves its running statistics alone), so its outputs are back when its backward
  // reads them; the last segment's are still there. The same numbers, at the cost of about one
  // more forward a step. `segment_nodes` > 0 cuts every that many nodes (the tests); 0 chooses the
  // cut that holds the fewest bytes (about the square root of the outputs' bytes, for a chain).
  // It relies on every layer's forward giving the same bits the second time (every op's forward
  // is deterministic on both backends; a forward that is not would make a segment's recomputed
  // outputs disagree with what later segments read).
  void set_recompute(bool on, size_t segment_nodes = 0) {
    recompute_ = on;
    segment_nodes_ = segment_nodes;
  }
  // The segments the last Setup cut the graph into (1: nothing is run again).
  size_t recompute_segments() const { return segments_; }

  // Forward in node order. Returns the last node's output (owned by its layer).
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx);
  // Backward in reverse node order from d(loss)/d(output). `before(i)` runs before node i's
  // backward, `after(i)` once it is done (node i's parameter gradients are final). A node
  // output read by several nodes gets the sum of their gradients (in a buffer set up for it, or,
  // read by two, added by the backward that reads it: LayerFlow::sums_gradient_parts).
  template <class B, class F>
  void BackwardEach(const Tensor& dy, bool accumulate, B before, F after) {
    StartBackward(dy);
    for (size_t i = nodes_.size(); i-- > 0;) {
      before(i);
      if (!recompute_from_.empty() && recompute_from_[i] != kNoRecompute) Recompute(i);
      BackwardNode(i, accumulate);
      after(i);
    }
  }

  // Starting values of parameters and buffers by full name ("layer1.0.conv1.weight"): an
  // imported model's weights, which Model::InitParams puts over its own initialisation.
  // `origin` names where they came from in errors (the ONNX file).
  void SetInitialValue(const std::string& name, std::vector<float> values);
  const std::map<std::string, std::vector<float>>& initial_values() const { return initial_; }
  void set_origin(std::string origin) { origin_ = std::move(origin); }
  const std::string& origin() const { return origin_; }

  // Bytes of activations the graph holds per sample: the layers' plus the gradient sums.
  int64_t ActivationBytesPerSample() const;
  // Bytes per sample of the gradient sums of node i's output (0 unless several nodes read it).
  int64_t GradSumBytesPerSample(size_t i) const;
  // Bytes per sample of node i's input-gradient buffers that are parts of the shared buffer (they
  // are in the layer's ActivationBytesPerSample, and in InputGradBytesPerSample once for all).
  int64_t SharedInputGradBytesPerSample(size_t i) const;
  // Bytes per sample of the shared input-gradient buffer (0 when not shared).
  int64_t InputGradBytesPerSample() const;
  // The same for outputs and saved buffers with activation recompute (set_recompute): node i's
  // part of them, and the one buffer they are placed in (0 without recompute).
  int64_t SharedOutputBytesPerSample(size_t i) const;
  int64_t OutputBytesPerSample() const;
  // What node i holds per sample that is not part of a shared buffer: the layer's activations and
  // its output's gradient sum, less its parts of the shared buffers (`dptrain plan`'s rows).
  int64_t OwnBytesPerSample(size_t i) const;

 private:
  struct Node {
    std::unique_ptr<Layer> layer;
    std::vector<int> inputs;
    std::string name;
    std::string label;  // name, or "<type> #<index>" when unnamed (profiles)
    Shape shape;
    int readers = 0;               // nodes reading this output (+1 for the graph output)
    bool nhwc = false;             // the output is channels-last (planned at Setup)
    Tensor grad_sum;               // (max N, ...) when readers > 1
    bool grad_sum_shared = false;  // placed with the input gradients
    const Tensor* out = nullptr;   // the last Forward's output
    const Tensor* grad = nullptr;  // d(loss)/d(out) in the running backward
    Tensor grad_view;              // grad_sum for the current batch
    // Two readers, and the backward that first reads the gradient (this node's, or an input's
    // through layers that pass it as it is) takes it in two parts (LayerFlow::sums_gradient_parts):
    // no grad_sum; the second reader's gradient waits in grad2 instead.
    bool sums_parts = false;
    const Tensor* grad2 = nullptr;
    // With sums_parts, where the backward that sums the parts takes a sampled one
    // (LayerFlow::sums_sampled_part): the reader that hands its gradient so (input_grad_stride),
    // or kNoNode. In a running backward, each part's stride (1: the whole gradient); once both
    // are in, the sampled one is grad2.
    bool sums_sampled = false;
    size_t sampled_reader = kNoNode;
    int64_t grad_stride = 1, grad2_stride = 1;
    int64_t shared_grad_bytes = 0;  // of its input gradients, in the shared buffer (max batch)
    std::vector<const Buffer*> input_slots;  // the shared buffer planned per input, or null
    int64_t shared_out_bytes = 0;      // of its output and saved buffers, in the recompute buffer
    const Buffer* out_slot = nullptr;  // its output's buffer there, or null
  };
  // An output or saved buffer asked for at Setup (SetupOptions::forward_buffer) with recompute on.
  struct OutSlot {
    size_t node = 0;
    bool output = true;  // else a saved buffer, read by its own layer only
    std::weak_ptr<Buffer> buffer;
  };
  static constexpr size_t kNoRecompute = static_cast<size_t>(-1);
  static constexpr size_t kNoNode = static_cast<size_t>(-1);
  // An input-gradient buffer asked for at Setup (SetupOptions::input_grad), placed once all are
  // known. Weak: a buffer its layer let go of takes no room.
  struct GradSlot {
    size_t node = 0, input = 0;
    std::weak_ptr<Buffer> buffer;
  };
  // Sets up every node (after the passes before Setup, with GraphPasses::Choose for each); throws
  // NhwcRefused with *failed = the node.
  void SetupNodes(const Shape& in, const SetupOptions& opts, size_t* failed);
  // Whether the gradient of node i's output may stay in two parts (Node::sums_parts): the first
  // layer from node i down through layers that pass a gradient as it is sums them as it reads.
  // *at: that layer's node.
  bool SumsPartsFrom(size_t i, size_t* at) const;
  // Places the input-gradient buffers asked for at Setup in one allocation (batch: the largest).
  void PlaceInputGrads(int64_t batch);
  // Cuts the graph into recompute segments and places the outputs and saved buffers asked for at
  // Setup in one allocation.
  void PlanRecompute(int64_t batch);
  // A buffer of `shape` that a later placement binds into a shared allocation.
  Tensor UnboundTensor(const Shape& shape, DType dtype, const std::string& label) const;
  void ForwardNode(size_t i, const Tensor& x, const ForwardContext& ctx);
  // Runs the forward of the segment ending at node `last` again (its first: recompute_from_).
  void Recompute(size_t last);
  void StartBackward(const Tensor& dy);
  void BackwardNode(size_t i, bool accumulate);
  // Adds `g` to the gradient of node j's output (the first contribution is used as it is).
  // stride: g's when it is a sampled part (Node::sampled_reader's), else 1.
  void AddGradient(int j, const Tensor& g, int64_t stride);

  Backend& backend_;
  std::vector<Node> nodes_;
  std::unique_ptr<GraphPasses> passes_;  // the last Setup's
  std::map<std::string, std::vector<float>> initial_;
  std::string origin_;
  bool fold_ = true;
  bool fuse_conv_pool_ = true;
  bool sum_gradient_parts_ = true;
  bool channels_last_ = true;
  bool share_input_grads_ = true;
  bool recompute_ = false;
  size_t segment_nodes_ = 0;
  size_t segments_ = 1;
  std::vector<OutSlot> out_slots_;
  std::set<const Buffer*> out_slot_buffers_;  // every placed one (ForwardNode's check)
  Tensor out_arena_;                          // the outputs' shared buffer
  // Per node: the first node of its segment when it is the last node of a segment that runs
  // again before its backward, else kNoRecompute (empty without recompute).
  std::vector<size_t> recompute_from_;
  Tensor fwd_x_;  // the last training forward's input and context, for Recompute
  ForwardContext fwd_ctx_;
  std::vector<GradSlot> grad_slots_;
  std::set<const Buffer*> slot_buffers_;  // every placed slot (BackwardNode's check)
  Tensor grad_arena_;                     // the shared input-gradient buffer
  int64_t setup_batch_ = 0;
  std::vector<const Tensor*> xs_;   // scratch: a node's inputs
  std::vector<const Tensor*> dxs_;  // scratch: a node's input gradients
};

}  // namespace dptrain
