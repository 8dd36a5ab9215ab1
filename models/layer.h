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
  // Channels-last activations (Backend::PrefersChannelsLast), planned by the graph: the layer's
  // inputs are NHWC in memory (all of them; shapes stay (N, C, H, W)), and a layer that chooses
  // its output's layout (Layer::ChoosesNhwcOut) writes NHWC. Any other layer given NHWC inputs
  // writes an NHWC output.
  bool nhwc_in = false;
  bool nhwc_out = false;
  // A first layer's convolution, ReLU and 2x2 max pool may run as one op where the backend has it
  // (Backend::Supports(ConvPoolDesc); Graph::set_fuse_conv_pool).
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
  // The gradient of input 0 may be returned sampled (Layer::InputGradStride): the backward that
  // sums it with the input's other reader's gradient takes it so (Layer::SumsSampledPart).
  bool sampled_input_grad = false;
};

// SetupOptions::input_grad's `input` for the gradient every input of the layer gets.
inline constexpr size_t kEveryInput = static_cast<size_t>(-1);

// A layer's buffer (of the largest batch) for the gradient of its input `input`, allocated at
// Setup. What it holds is read only until the backward of the layer that produced that input
// (and of any layer that passes the gradient on: Layer::PassesGradient) is done.
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

// Thrown by SetupInputs when a layer that said it takes channels-last inputs (TakesNhwc) finds,
// once it sees their shapes, that it cannot: the graph then sets up again with that node on NCHW.
struct NhwcRefused {};

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

  // Folding, before Setup: the graph offers each one-input layer the layer whose output only it
  // reads (FoldIntoInput). A ReLU asks that producer to apply the ReLU itself (FoldRelu: true
  // when the producer now outputs max(y, 0) and gates its gradient by that output, as a batch
  // norm, a convolution and a residual sum do) and then passes its input and gradient through,
  // holding no buffers.
  virtual void FoldIntoInput(Layer& /*producer*/) {}
  // Before Setup and before the folding, whatever the folding: the graph hands each one-input
  // layer the layer whose output only it reads. A batch norm offers the convolution before it to
  // write that output in bf16 (OfferBf16Output, Conv2dDesc::y_bf16): a choice of precision (the
  // rounding cuDNN and PyTorch's autocast apply to a bf16 convolution's output), not a fusion,
  // so a model without folding makes it too.
  virtual void ReadsOnlyOutputOf(Layer& /*producer*/) {}
  // The same offer to a layer that reads two node outputs: input k's producer, which only it
  // reads (a residual sum applies a batch norm before it: Add, BatchNorm::OfferDeferredApply).
  virtual void FoldIntoInputs(size_t /*k*/, Layer& /*producer*/) {}
  virtual bool FoldRelu() { return false; }
  // A max pool offered a ReLU's output (a ReLU layer's, or a producer's with the ReLU folded in)
  // takes over the ReLU's backward gate: it gates its pooled gradient by its own output (> 0)
  // before scattering it to the window maxima. That is the ReLU's gate on the scattered gradient
  // bit for bit (a window's maximum is > 0 exactly when the ReLU passed it; every other position
  // gets 0 either way) on a quarter of the elements for a 2x2 pool, and one pass over the
  // ReLU's output fewer. True when this layer's output is a ReLU's and its backward now skips
  // that gate.
  virtual bool HandOverReluGate() { return false; }
  // Whether this layer, set up for input `in` (channels-last or not), can write its input
  // gradient in bf16 for the bf16 convolution whose output it alone reads (Conv2d::OfferBf16Dy:
  // a batch norm, a non-overlapping max pool after the folded ReLU).
  virtual bool CanWriteBf16Dx(const Shape& /*in*/, bool /*nhwc*/) const { return false; }
  // The other direction: a bf16 convolution whose input only it reads (directly or through a
  // folded ReLU) offers, before Setup, to read that input in bf16 (Conv2dDesc::x_bf16). A batch
  // norm takes the offer at its Setup where the backend runs both (BatchNormArgs::y_bf16, and
  // the reader's CanReadBf16Input for the shape) and tells the reader either way
  // (ReadBf16Input), before the reader's own Setup; a folded ReLU passes the offer on to the
  // layer it is folded into. The same bits, without the f32 output and the pass that rounded it.
  // A batch norm makes the same offer to the convolution whose output only it reads
  // (ReadsOnlyOutputOf): there the rounding is new (Conv2dDesc::y_bf16).
  virtual void OfferBf16Output(Layer& /*reader*/) {}
  // The same offer for an output that several layers read, every one of them one that would read
  // its input in bf16 (WantsBf16Input: a ResNet block's output, read by the next block's
  // convolution and shortcut), made by the graph with all the readers, before Setup and with the
  // folding. A residual sum takes it at its Setup where every reader CanReadBf16Input and the
  // backend writes it (Backend::WritesBf16Sums), and tells each reader either way
  // (ReadBf16Input); a folded ReLU passes it on to the layer it is folded into.
  virtual void OfferBf16OutputToAll(const std::vector<Layer*>& /*readers*/) {}
  virtual bool WantsBf16Input() const { return false; }
  virtual bool CanReadBf16Input(const Shape& /*in*/, bool /*nhwc*/, Precision /*p*/) const {
    return false;
  }
  virtual void ReadBf16Input(bool /*bf16*/) {}
  // Whether Backward may return the gradient it was given (dy, or a view of it) as an input's
  // gradient (a folded ReLU, a flatten that is a view, a residual sum): the graph then keeps the
  // buffer holding dy until that input's producer is done with it. Graph::BackwardNode checks it.
  virtual bool PassesGradient() const { return false; }
  // Whether Backward returns dy itself, untouched, as its input's gradient (a folded ReLU, a ReLU
  // whose gate a max pool took): the graph may then hand the input a gradient in two parts.
  virtual bool PassesGradientAsIs() const { return false; }
  // A gradient in two parts (Backend::TakesGradientParts): whether the backward can take its
  // output's gradient as two tensors and add them as it reads them (BackwardInputsSum); valid
  // after Setup. The graph then hands it the two gradients of an output that two nodes read
  // (through layers that pass a gradient as it is) instead of summing them into a buffer first.
  virtual bool SumsGradientParts() const { return false; }
  // Whether BackwardInputsSum also takes, as its second part, an input gradient sampled at a
  // stride (InputGradStride): the graph then offers the part's layer to hand it so
  // (SetupOptions::sampled_input_grad).
  virtual bool SumsSampledPart() const { return false; }
  // Valid after Setup: s above 1 when the gradient of input 0 that Backward returns holds only
  // every s-th pixel of every s-th row of that input, channels-last, (N, C, H / s, W / s), the
  // rest being zero (a strided 1x1 convolution's: Conv2dDesc::dx_sub). Only where the graph
  // offered it (SetupOptions::sampled_input_grad); else 1.
  virtual int64_t InputGradStride() const { return 1; }
  // BackwardInputs with dy = dy_a + dy_b, the same bits as Backend::Add(dy_a, dy_b) then
  // BackwardInputs. Only where SumsGradientParts says so.
  // dy_b may be sampled at b_stride above 1 where SumsSampledPart says so.
  virtual void BackwardInputsSum(const Tensor& /*dy_a*/, const Tensor& /*dy_b*/,
                                 int64_t /*b_stride*/, bool /*accumulate*/,
                                 std::vector<const Tensor*>* /*dx*/) {
    DPT_THROW(InternalError) << "layer '" << label() << "' takes no gradient in two parts";
  }
  // Whether Forward may return its input (or a view of it) as its output (a folded ReLU, a flatten
  // or reshape that is a view, a convolution that leaves its work to the pool fused with it, a
  // batch norm whose reading sum applies it): the
  // graph then keeps the input's buffer for this layer's readers too (Graph::set_recompute), and
  // checks it.
  virtual bool ForwardPassesInput() const { return false; }
  // Whether Backward may return its output buffer, with the gradient written over it, as an
  // input's gradient (a residual sum with a folded ReLU): with activation recompute the graph
  // then keeps that buffer from other segments until the inputs' producers are done with it.
  virtual bool GradientInOutput() const { return false; }

  // Channels-last, asked by the graph before Setup: whether the layer runs on NHWC inputs (and
  // then writes an NHWC output: batch norm, pooling, the elementwise layers), and whether it
  // writes either layout whatever its input's (a convolution: SetupOptions::nhwc_out).
  virtual bool TakesNhwc() const { return false; }
  virtual bool ChoosesNhwcOut() const { return false; }
  // Asked at Setup, of a layer planned channels-last whose readers all prefer NCHW inputs: whether,
  // given the channels-last input `in`, it can write its output NCHW as it goes
  // (SetupOptions::nhwc_out false; a max pool). The graph then has it do so.
  virtual bool CanWriteNchwFromNhwc(const Shape& /*in*/) const { return false; }
  // Whether a channels-last input costs this layer a transpose that an NCHW one does not (a
  // flatten): the graph has a layer before it write NCHW where that layer can (above).
  virtual bool PrefersNchwIn() const { return false; }

  // Bytes of activations this layer holds per sample (outputs, saved inputs, workspaces), for
  // `dptrain plan`.
  virtual int64_t ActivationBytesPerSample() const { return 0; }
  // Bytes of per-layer workspaces that do not scale as activations do (0 for most layers).
  virtual int64_t WorkspaceBytes() const { return 0; }
  // The backend plans this layer runs (a plan may be shared with other layers of equal shape).
  virtual void ListPlans(std::vector<const OpPlan*>* /*out*/) const {}

 protected:
  Backend& backend_;
  std::string name_;
};

}  // namespace dptrain
