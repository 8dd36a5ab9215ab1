// SPDX-License-Identifier: Apache-2.0
// The layer interface. A layer holds its output and input-gradient buffers (sized for the largest
// batch at Setup), keeps what backward needs from forward, and talks only to the Backend.
// Parameters and gradients are not owned: the Model binds views into its flat buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/tensor.h"

namespace dptrain {

// How a parameter is initialised (PyTorch defaults).
enum class Init : uint8_t {
  kFanInUniform,  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)): nn.Conv2d / nn.Linear weight and bias
  kZeros,
  kOnes,
};

// A parameter or buffer a layer exposes. `value` and `grad` point at the layer's members; the
// Model assigns views of its flat buffers to them. Buffers (running statistics) have no grad.
struct ParamRef {
  std::string name;  // relative to the layer: "weight", "bias", "0.conv1.weight"
  Shape shape;
  Init init = Init::kZeros;
  int64_t fan_in = 1;
  Tensor* value = nullptr;
  Tensor* grad = nullptr;
};

struct SetupOptions {
  Precision precision = Precision::kF32;
  bool need_dx = true;  // false for the first layer: nobody consumes the gradient of the input
  // Channels-last activations (BackendCapabilities::channels_last), planned by the graph's layout
  // pass (models/passes/layout.cc): the layer's inputs are NHWC in memory (all of them; shapes
  // stay (N, C, H, W)), and a layer that chooses its output's layout (a convolution, a global
  // pool, a flatten) writes NHWC where nhwc_out says. Any other layer given NHWC inputs writes an
  // NHWC output, except a max pool told nhwc_out = false (it writes NCHW as it goes).
  bool nhwc_in = false;
  bool nhwc_out = false;
  // A first layer's convolution, ReLU and 2x2 max pool may run as one op where the backend has it
  // (Backend::Supports(ConvPoolDesc); Graph::set_fuse_conv_pool): read by the fusion pass.
  bool fuse_conv_pool = true;
  // Where the buffer for the gradient of input `input` comes from (InputGradBuffer): set by the
  // graph, which places every layer's input gradients in one buffer shared by those whose
  // lifetimes in backward do not overlap (Graph::set_share_input_grads). Unset: the layer's own.
  // `input` kEveryInput: one gradient that every input gets (a residual sum's gated gradient).
  std::function<Tensor(size_t input, const Shape& shape, DType dtype, const std::string& label)>
      input_grad;
  // Where the layer's output buffer, and the buffers only its own backward reads that its forward
  // writes (a max pool's window positions), come from (OutputBuffer, SavedBuffer): set by the graph
  // when it recomputes activations (Graph::set_recompute), which places them in one buffer shared
  // by the segments of the graph that are run again before their backward. Unset: the layer's own.
  std::function<Tensor(const Shape& shape, DType dtype, const std::string& label, bool output)>
      forward_buffer;
  // The graph may run this layer's forward again (ForwardContext::recompute) before its backward.
  bool recompute = false;
  // The gradient of input 0 may be returned sampled (LayerFlow::input_grad_stride): the backward
  // that sums it with the input's other reader's gradient takes it so
  // (LayerFlow::sums_sampled_part).
  bool sampled_input_grad = false;
};

// SetupOptions::input_grad's `input` for the gradient every input of the layer gets.
inline constexpr size_t kEveryInput = static_cast<size_t>(-1);

// A layer's buffer (of the largest batch) for the gradient of its input `input`, allocated at
// Setup. What it holds is read only until the backward of the layer that produced that input
// (and of any layer that passes the gradient on: LayerFlow::passes_gradient) is done.
Tensor InputGradBuffer(Backend& backend, const SetupOptions& opts, size_t input, const Shape& shape,
                       DType dtype, const std::string& label);

// A layer's buffer (of the largest batch) for its output, allocated at Setup. What it holds is
// read by the layer's readers, until their backward is done; with activation recompute it may be
// written over by other layers in between, and the graph then runs this layer's forward again
// before those backwards.
Tensor OutputBuffer(Backend& backend, const SetupOptions& opts, const Shape& shape, DType dtype,
                    const std::string& label);
// A buffer the layer's forward writes in training and only its own backward reads (a max pool's
// window positions): shared as an output is.
Tensor SavedBuffer(Backend& backend, const SetupOptions& opts, const Shape& shape, DType dtype,
                   const std::string& label);

// How a layer, as set up, hands tensors on: what the graph's memory plans, its checks and its
// gradient sums rely on. Each layer fills its own at Setup (Layer::flow_) from what its
// descriptor says (models/passes decided it); the defaults are a layer that owns its output and
// its input gradients. Facts about the layer's own execution, not offers to its neighbours.
struct LayerFlow {
  // Forward may return its input (or a view of it) as its output (a folded ReLU, a flatten or
  // reshape that is a view, a convolution that leaves its work to the pool fused with it, a batch
  // norm whose reading sum applies it): the graph keeps the input's buffer for this layer's
  // readers too (Graph::set_recompute), and checks it.
  bool forward_passes_input = false;
  // Backward may return the gradient it was given (dy, or a view of it) as an input's gradient (a
  // folded ReLU, a flatten that is a view, a residual sum without a ReLU): the graph then keeps
  // the buffer holding dy until that input's producer is done with it.
  bool passes_gradient = false;
  // Backward returns dy itself, untouched, as its input's gradient (a folded ReLU, a ReLU whose
  // gate a max pool took): the graph may then hand the input a gradient in two parts.
  bool passes_gradient_as_is = false;
  // Backward may return its output buffer, with the gradient written over it, as an input's
  // gradient (a residual sum with a folded ReLU): with activation recompute the graph then keeps
  // that buffer from other segments until the inputs' producers are done with it.
  bool gradient_in_output = false;
  // BackwardInputsSum takes the output's gradient as two tensors and adds them as it reads them
  // (on a backend with BackendCapabilities::gradient_parts): the graph then hands it the two
  // gradients of an output that two nodes read (through layers that pass a gradient as it is)
  // instead of summing them into a buffer first.
  bool sums_gradient_parts = false;
  // ... and takes, as its second part, an input gradient sampled at a stride (input_grad_stride):
  // the graph then offers the part's layer to hand it so (SetupOptions::sampled_input_grad).
  bool sums_sampled_part = false;
  // Above 1: the gradient of input 0 that Backward returns holds only every s-th pixel of every
  // s-th row of that input, channels-last, (N, C, H / s, W / s), the rest being zero (a strided
  // 1x1 convolution's: Conv2dDesc::dx_sub). Only where the graph offered it.
  int64_t input_grad_stride = 1;
};

// Per-forward context. sample_offset is the position of this batch's first sample within the
// step's global batch so stochastic layers (dropout) draw the same numbers on any world size.
struct ForwardContext {
  bool training = false;
  uint64_t seed = 0;  // run seed
  int64_t step = 0;   // optimizer step
  int64_t sample_offset = 0;
  // The graph is running this forward again before the backward (Graph::set_recompute): the same
  // outputs as the first time, but no state changes (batch norm leaves its running statistics).
  bool recompute = false;
};

class Layer {
 public:
  Layer(Backend& backend, std::string name) : backend_(backend), name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  // For messages and memory reports: the name, or the type for unnamed layers ("relu").
  std::string label() const { return name_.empty() ? type() : name_; }
  virtual std::string type() const = 0;

  // Prepares for inputs of shape `in` (dimension 0 = the largest batch); returns the output
  // shape. Allocates output / dx buffers and backend plans. Called once.
  virtual Shape Setup(const Shape& in, const SetupOptions& opts) = 0;
  // Trainable parameters and non-trainable buffers, in forward order.
  virtual void ListParams(std::vector<ParamRef>* /*out*/) {}
  virtual void ListBuffers(std::vector<ParamRef>* /*out*/) {}

  // x: (n, ...) with n <= the Setup batch. Returns the output (a view owned by the layer, valid
  // until the next Forward). In training mode keeps x and what backward needs.
  virtual const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) = 0;
  // dy: gradient of the loss w.r.t. the last Forward's output. Writes parameter gradients
  // (added to existing values when accumulate is true) and returns dx (undefined when the layer
  // was set up with need_dx = false).
  virtual const Tensor& Backward(const Tensor& dy, bool accumulate) = 0;

  // Layers that read several node outputs (add, concat) override these three; the Graph calls
  // only them, and for every other layer they forward to the one-input versions above. A layer's
  // gradients for its inputs come back in `dx`, one per input (entries are unspecified when the
  // layer was set up with need_dx = false).
  virtual Shape SetupInputs(const std::vector<Shape>& in, const SetupOptions& opts) {
    DPT_CHECK_AS(ConfigError, in.size() == 1)
        << "layer '" << label() << "' (" << type() << ") takes one input, not " << in.size();
    return Setup(in[0], opts);
  }
  virtual const Tensor& ForwardInputs(const std::vector<const Tensor*>& x,
                                      const ForwardContext& ctx) {
    return Forward(*x[0], ctx);
  }
  virtual void BackwardInputs(const Tensor& dy, bool accumulate, std::vector<const Tensor*>* dx) {
    dx->assign(1, &Backward(dy, accumulate));
  }

  // BackwardInputs with dy = dy_a + dy_b, the same bits as Backend::Add(dy_a, dy_b) then
  // BackwardInputs: only where flow().sums_gradient_parts says so, and with dy_b sampled at
  // b_stride above 1 only where flow().sums_sampled_part does.
  virtual void BackwardInputsSum(const Tensor& /*dy_a*/, const Tensor& /*dy_b*/,
                                 int64_t /*b_stride*/, bool /*accumulate*/,
                                 std::vector<const Tensor*>* /*dx*/) {
    DPT_THROW(InternalError) << "layer '" << label() << "' takes no gradient in two parts";
  }

  // Bytes of activations this layer holds per sample (outputs, saved inputs, workspaces), for
  // `dptrain plan`.
  virtual int64_t ActivationBytesPerSample() const { return 0; }
  // Bytes of per-layer workspaces that do not scale as activations do (0 for most layers).
  virtual int64_t WorkspaceBytes() const { return 0; }
  // The backend plans this layer runs (a plan may be shared with other layers of equal shape).
  virtual void ListPlans(std::vector<const OpPlan*>* /*out*/) const {}

  // How the layer, as set up, hands tensors on (valid after Setup).
  const LayerFlow& flow() const { return flow_; }

 protected:
  Backend& backend_;
  std::string name_;
  LayerFlow flow_;  // filled by the layer's Setup
};

}  // namespace dptrain
