// SPDX-License-Identifier: Apache-2.0
// The Backend seam: memory, copies, synchronisation and every op the layers and the optimizer
// need, described by small plain descriptor structs. Layers, models, the trainer and optimizers
// call only this interface; CPU (oneDNN) and CUDA (cuDNN/cuBLAS) implement it.
//
// Contracts common to all ops:
//  - Tensors are dense row-major (NCHW for images, [N, F] for features, PyTorch weight layouts:
//    conv OIHW, linear [out, in]). Activations, weights and gradients are f32 in memory; a
//    descriptor's `precision` selects the compute type (bf16/f16 run the math in that type with
//    f32 master weights where the backend supports it).
//  - Inputs are `const Tensor&`; outputs are `Tensor*` and are overwritten, except weight
//    gradients with `accumulate = true`, which are added to (gradient accumulation).
//  - Prepare* does the expensive work once per shape (primitive / algorithm choice, workspace
//    size) and caches it; Run-style calls allocate nothing.
//  - Ops are asynchronous with respect to the host on devices that have streams; anything that
//    returns a value to the host (CountNonFinite, CopyToHost) synchronises.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/elementwise.h"
#include "core/memory/caching_allocator.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace dptrain {

enum class Precision : uint8_t { kF32, kBF16, kF16 };
const char* PrecisionName(Precision p);

// Groups split the channels as torch.nn.Conv2d's `groups`: group g maps input channels
// [g*C/G, (g+1)*C/G) to output channels [g*K/G, (g+1)*K/G); G = C = K is depthwise. The weight is
// (K, C/G, R, S). `dilation` spaces the kernel taps (PyTorch's dilation, 1 = dense).
struct Conv2dDesc {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input (N, C, H, W)
  int64_t k = 0, r = 0, s = 0;         // output channels, kernel height, width
  int64_t stride = 1, pad = 0;
  bool bias = true;
  Precision precision = Precision::kF32;
  int64_t groups = 1, dilation = 1;
  // y = max(conv + bias, 0): a ReLU folded into the convolution (Conv2dFusion::relu). Forward only:
  // the caller gates dy by y before the backward passes.
  bool relu = false;
  // Channels-last (NHWC) activations: x and dx (x_nhwc), y and dy (y_nhwc) hold (N, C, H, W)
  // as N, H, W, C in memory. Set by the graph on backends that ask for them
  // (Backend::PrefersChannelsLast); the shapes above stay (N, C, H, W).
  bool x_nhwc = false, y_nhwc = false;
  // The backward passes read dy in bf16 (bf16 precision only), as the batch norm or 2x2 max pool
  // that alone reads y writes it (BatchNormArgs::dx_bf16, PoolDesc::dx_bf16): the rounding the
  // backward applies to an f32 dy anyway.
  bool dy_bf16 = false;
  // The forward and the weight gradient read x in bf16 (bf16 precision only), as the batch norm
  // whose output only this convolution reads writes it (BatchNormArgs::y_bf16): the rounding the
  // convolution applies to an f32 x anyway, without the f32 copy and the pass that rounded it.
  bool x_bf16 = false;
  // bf16 only: the forward writes y in bf16 (its f32 accumulators rounded to nearest even), for
  // the batch norm that alone reads it (BatchNormArgs::x_bf16), as cuDNN writes a 16-bit
  // convolution's y and as PyTorch's autocast hands a bf16 convolution's output to its batch
  // norm. Not with a folded ReLU. Backends that write it say so (Backend::Supports).
  bool y_bf16 = false;
  // The backward writes dx at the pixels a 1x1 convolution with stride above 1 reads only: dx is
  // (N, C, out_h, out_w), channels-last, and the input gradient is that at every stride-th pixel
  // of every stride-th row, zero elsewhere. For the residual sum that adds it as it reads it
  // (ReluBackwardSum's b_stride), so neither writes nor reads the zeros: a ResNet's strided
  // shortcut. Backends that write it say so (Backend::Supports).
  bool dx_sub = false;
  int64_t out_h() const { return (h + 2 * pad - dilation * (r - 1) - 1) / stride + 1; }
  int64_t out_w() const { return (w + 2 * pad - dilation * (s - 1) - 1) / stride + 1; }
  int64_t group_c() const { return c / groups; }  // input channels each output channel sees
  int64_t weight_numel() const { return k * group_c() * r * s; }
  // Floating-point operations (2 per multiply-add) of one pass over the batch: forward,
  // backward-data and backward-weights each do this many (the profile's GFLOP/s).
  double flops() const {
    return 2.0 * static_cast<double>(n) * static_cast<double>(weight_numel()) *
           static_cast<double>(out_h() * out_w());
  }
  // Positive sizes, groups dividing C and K, and a non-empty output.
  bool Valid() const;
  std::string ToString() const;
};

struct LinearDesc {
  int64_t n = 0, in = 0, out = 0;  // x: (n, in), W: (out, in), y: (n, out)
  bool bias = true;
  Precision precision = Precision::kF32;
  // As Conv2dDesc::flops: 2 per multiply-add, for each of the three passes.
  double flops() const {
    return 2.0 * static_cast<double>(n) * static_cast<double>(in) * static_cast<double>(out);
  }
  std::string ToString() const;
};

// Square-window pooling as torch.nn.MaxPool2d / AvgPool2d: `ceil_mode` rounds the output size
// up (a last window may hang past the padding, but never starts in it), `count_include_pad`
// makes the average count padded zeros (PyTorch's default; ONNX AveragePool's default is 0).
enum class PoolKind : uint8_t { kMax, kAvg };
struct PoolDesc {
  PoolKind kind = PoolKind::kMax;
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kernel = 2, stride = 2, pad = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
  bool nhwc = false;  // x, y and their gradients channels-last (Conv2dDesc::x_nhwc)
  // With nhwc, y and dy NCHW instead (x and dx stay channels-last): a max pool whose one reader
  // is a flatten writes the order the flatten hands on as it is, so no transpose follows it
  // (GraphPasses::CanWriteNchwFromNhwc).
  bool y_nchw = false;
  // Max pooling's backward writes dx in bf16 (dy stays f32), for the bf16 convolution that
  // produced x and reads its gradient so (Conv2dDesc::dy_bf16): the values it would round to
  // bf16 itself, without the f32 copy. Windows must not overlap (stride >= kernel), so every dx
  // element is one dy value or zero, and rounding it is rounding dy.
  bool dx_bf16 = false;
  int64_t out_h() const { return OutSize(h); }
  int64_t out_w() const { return OutSize(w); }
  // Positive sizes, the padding within half the window (as PyTorch asks), a non-empty output.
  bool Valid() const;
  std::string ToString() const;

 private:
  int64_t OutSize(int64_t in) const;
};

// A convolution with its ReLU folded in (Conv2dDesc::relu) and the 2x2 max pool (stride 2, no
// padding, floor mode) that alone reads it, run as one op: the convolution's full-size output
// (4x the pooled) is never written, and the weight gradient is taken from the pooled gradient and
// the window position each maximum came from (no scattered full-size gradient). For first layers:
// a few input channels (the pixel's channels), stride 1, no groups or dilation, and no input
// gradient. `conv` describes the convolution, `pool` the pool over its output (its nhwc flag is
// the pooled output's layout, conv.x_nhwc the input's).
struct ConvPoolDesc {
  static constexpr int64_t kMaxInputChannels = 4;
  Conv2dDesc conv;
  PoolDesc pool;
  // The shapes and flags above agree with each other and fit this op's cases (not whether a
  // backend runs it: Backend::Supports).
  bool Valid() const;
  std::string ToString() const;
};

// The descriptors of the planned ops behind the op-generic planned entry (Backend::Prepare and
// Run(plan, op), core/ops.h's PlannedOp): one alternative per op family, each planned once per
// shape and run many times. Pooling is the first; a new planned op (the transformer's attention,
// layer norm, ...) is a new alternative here and in PlannedOp, not new methods of the seam.
using PlanDesc = std::variant<PoolDesc>;

// What Prepare* returns: backend-specific state for one shape. `workspace_bytes` is the size of
// the per-call workspace a layer must allocate once and pass back (max-pool indices).
class OpPlan {
 public:
  virtual ~OpPlan() = default;
  size_t workspace_bytes = 0;
  // Device memory the plan itself holds (staging buffers for layout/precision conversion,
  // gradient accumulators), shared by every layer that uses this plan. For memory planning.
  size_t held_bytes = 0;
};

// Time spent in one kind of op for one graph node (profiling, see Backend::EnableProfiling).
struct OpStat {
  std::string name;
  std::string node;  // the graph node it ran for; "" outside the graph (loss, optimizer, ...)
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // counted for convolutions and linear layers (their descriptors' flops())
};

struct BatchNormArgs {
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch (PyTorch)
  double eps = 1e-5;
  // y = max(batchnorm(x), 0): the ReLU that alone reads this batch norm, folded in by the graph
  // (one pass over the activation instead of two, and no ReLU buffers). Backward then takes the
  // forward's y, whose zeros gate dy (exactly ReLU's backward).
  bool relu = false;
  bool nhwc = false;  // x, y and their gradients channels-last (Conv2dDesc::x_nhwc)
  // Backward writes dx in bf16 (rounded to nearest even), for the bf16 convolution before it,
  // whose backward reads its dy so (Conv2dDesc::dy_bf16): the rounding it would apply to an f32
  // dx itself, without the f32 copy. Backends that run it say so (Backend::Supports).
  bool dx_bf16 = false;
  // Forward writes y in bf16 (rounded to nearest even), for the bf16 convolution that alone reads
  // it (Conv2dDesc::x_bf16): the same bits that convolution would round an f32 y to. Backward
  // still reads x (the folded ReLU's gate comes from x; see CpuBackend::BatchNormBackward).
  bool y_bf16 = false;
  // x is bf16: the output of the bf16 convolution before it (Conv2dDesc::y_bf16). The statistics,
  // the output and the gradients are those of x widened to f32, bit for bit; half the bytes read
  // in all four passes over x. Channels-last only.
  bool x_bf16 = false;
};

// How batch norm sees its input x, (N, C) or (N, C, H, W): per channel c, n samples of hw
// positions each (hw = 1 for (N, C)). Throws InternalError for any other rank.
struct BatchNormDims {
  int64_t n, c, hw;
};
BatchNormDims BatchNormShape(const Shape& x);

// The rows and row lengths (in floats) of a CopyColumns call, after checking that both tensors
// are f32 with equal dimension 0 and that the columns lie inside both rows (InternalError).
struct ColumnCopy {
  int64_t rows, src_pitch, dst_pitch;
};
ColumnCopy CheckColumnCopy(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                           int64_t cols);

// The planes (N * C) and plane sizes of a Pad2d call, after checking that both tensors are f32
// (N, C, H, W) with equal N and C (InternalError otherwise).
struct PadDims {
  int64_t planes, h, w, out_h, out_w;
};
PadDims CheckPad2d(const Tensor& x, const Tensor& y);
// The (N, C, H * W) of a ToChannelsLast / FromChannelsLast call, after checking both tensors.
struct LayoutDims {
  int64_t n, c, hw;
};
LayoutDims CheckLayoutChange(const Tensor& x, const Tensor& y, const char* op);
// The rows of a MulRows / AddRows / RowDot / RowSum call: `n` values in rows of n / rows
// (InternalError unless rows divides n).
int64_t RowLength(int64_t n, int64_t rows, const char* op);

// A backend's own tuning, from the run's config; each backend acts on the fields it has.
struct BackendOptions {
  // Compute threads (CPU: OpenMP/oneDNN threads, set for the calling thread at every Configure
  // when above 0; ignored elsewhere). Before any plan: oneDNN splits a primitive's work for the
  // threads there are when it is created, so plans made earlier keep their old split.
  int threads = 0;
  // train.deterministic: every op gives the same bits on every run (CUDA: only deterministic
  // cuDNN algorithms, an error naming the layer when a conv has none; the CPU backend is
  // deterministic for a given thread count).
  bool deterministic = false;
  // train.cudnn_benchmark: choose algorithms by timing them on this device (CUDA: cuDNN's
  // cudnnFind*, under the same rules as the heuristic choice) instead of by heuristics. The
  // choice may then differ between runs and ranks.
  bool timed_algorithm_search = false;
  // train.winograd: fp32 3x3 stride-1 convolutions with at least 32 input and output channels
  // by Winograd's F(4x4, 3x3) (CPU: oneDNN's jit_wino_4x3; about 2x faster there, with a larger
  // rounding error than the direct algorithm). Ignored by backends without it (CUDA).
  bool winograd = false;
  // train.tf32: fp32 convolutions may run on tensor cores in TF32 (inputs rounded to a 10-bit
  // mantissa, f32 accumulation), as PyTorch's default torch.backends.cudnn.allow_tf32 = True.
  // Off: FMA-only fp32, the numerics the CPU backend and the conformance suite define. Matmuls
  // (linear layers) stay fp32 either way, as PyTorch's default
  // torch.backends.cuda.matmul.allow_tf32 = False. Ignored by backends without TF32 (the CPU).
  bool tf32 = false;
  // Whether the CPU backend offers what only it runs: the fused convolution + pool (ConvPoolDesc),
  // the sampled input gradient (Conv2dDesc::dx_sub), the bf16 handoffs the CUDA backend refuses
  // (a bf16 y or dy with a bias; 16-bit batch-norm tensors on NCHW activations), its own
  // convolution algorithms, a staged input per layer where layers share a plan (one per plan, as
  // on CUDA, without) and a convolution's input gradient with a flipped copy of its kernel
  // (CpuBackend::FlipsBackwardData). `dptrain plan` sizing a GPU job where there is no GPU builds
  // the model on the CPU backend with them off, so that it plans the tensors the CUDA backend
  // allocates. Ignored by backends without them.
  bool cpu_fusions = true;
};

// What a backend offers the graph beyond the ops every backend runs (all false: nothing).
struct BackendCapabilities {
  // Keep 4-D activations channels-last (NHWC) between the ops that take them (convolution,
  // batch norm, pooling, the elementwise ops): the CPU backend's convolutions run on NHWC without
  // a reorder in and out of each. A backend that says yes supports the descriptors' nhwc flags
  // (BatchNormArgs::nhwc on every batch-norm call).
  bool channels_last = false;
  // A batch norm applied by the residual sum that alone reads it (BatchNormAffineTraining,
  // AffineAdd: see "a batch norm applied by the sum" below).
  bool deferred_batch_norm = false;
  // AffineAdd writes a bf16 y, and ReluBackward and ReluBackwardSum gate by a bf16 y: for a
  // residual sum that only bf16 convolutions read (a ResNet block's output, read by the next
  // block's convolution and shortcut), which then read it without rounding it themselves.
  bool bf16_sums = false;
  // A gradient in two parts (ReluBackwardSum, BatchNormBackwardSum: see below).
  bool gradient_parts = false;
  // The profile times ops on a device stream (StartDeviceTimer), not on the host.
  bool device_timers = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  // ---- the backend's own tuning (BackendOptions) and what it offers the graph
  // (BackendCapabilities): one entry each, the named setters and queries below are shorthands ----
  const BackendOptions& options() const { return options_; }
  // Sets every option; the backend acts on those it has (BackendOptions says what each does)
  // and ignores the others. Before preparing plans (a backend drops the cached plans an option
  // changes).
  void Configure(const BackendOptions& next) {
    ApplyOptions(next);
    options_ = next;
  }
  void SetThreads(int threads) { Set(&BackendOptions::threads, threads); }
  void SetDeterministic(bool on) { Set(&BackendOptions::deterministic, on); }
  void SetTimedAlgorithmSearch(bool on) { Set(&BackendOptions::timed_algorithm_search, on); }
  void SetWinograd(bool on) { Set(&BackendOptions::winograd, on); }
  void SetTf32(bool on) { Set(&BackendOptions::tf32, on); }
  void SetCpuFusions(bool on) { Set(&BackendOptions::cpu_fusions, on); }
  virtual BackendCapabilities capabilities() const { return {}; }
  bool PrefersChannelsLast() const { return capabilities().channels_last; }
  bool DefersBatchNormApply() const { return capabilities().deferred_batch_norm; }
  bool WritesBf16Sums() const { return capabilities().bf16_sums; }
  bool TakesGradientParts() const { return capabilities().gradient_parts; }
  bool TimesOpsOnDevice() const { return capabilities().device_timers; }
  // Why train.winograd would change nothing here at precision `p`, or "" when it acts.
  virtual std::string WinogradProblem(Precision /*p*/) const {
    return "only the CPU backend has it (cuDNN chooses its own algorithms)";
  }
  // Whether a convolution was planned by Winograd since the option last changed (whether its
  // buffers are in the memory a model set up takes).
  virtual bool WinogradPlanned() const { return false; }

  CachingAllocator& allocator() { return *allocator_; }
  // Bytes of workspace the backend shares between all ops (oneDNN scratchpad, cuDNN workspace).
  virtual size_t SharedWorkspaceBytes() const { return 0; }
  // Drops every cached plan (and the shared workspace) so their memory can be freed once the
  // layers holding them are gone: used when a batch size that did not fit is abandoned.
  virtual void ReleasePlans() {}
  // An uninitialised tensor from the caching allocator; `label` names it in OOM reports.
  Tensor Empty(const Shape& shape, DType dtype, std::string_view label);
  Tensor Zeros(const Shape& shape, DType dtype, std::string_view label);

  // ---- memory and copies (byte counts must match) ----
  virtual void CopyFromHost(const void* src, Tensor* dst) = 0;
  // As CopyFromHost, without waiting for the device: `src` may be reused as soon as this returns
  // (a device backend stages it in pinned memory and copies on its own stream), and the copy is
  // ordered before every later op of this backend. For the batches of every micro-step.
  virtual void CopyFromHostAsync(const void* src, Tensor* dst) { CopyFromHost(src, dst); }
  virtual void CopyToHost(const Tensor& src, void* dst) = 0;  // synchronises
  virtual void Copy(const Tensor& src, Tensor* dst) = 0;
  // Row by row: src seen as (rows, src_pitch) and dst as (rows, dst_pitch), rows = dimension 0
  // of both, copies columns [src_col, src_col + cols) of src into [dst_col, dst_col + cols) of
  // dst (the channel concatenation and its gradient). f32; src and dst must not overlap.
  void CopyColumns(const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col, int64_t cols) {
    Run(op::CopyColumns{src, src_col, dst, dst_col, cols});
  }
  void Zero(Tensor* t) { Run(op::Zero{t}); }
  void Fill(Tensor* t, float value) { Run(op::Fill{t, value}); }  // f32
  virtual void Synchronize() = 0;

  // ---- the op-generic entry (core/ops.h): every op below without a plan of its own is one of
  // Op's alternatives, and the named methods build it and call Run. A backend implements Run with
  // a case per alternative; a new op is a new alternative, not a new method of this seam. ----
  virtual void Run(const Op& op) = 0;

  // ---- support queries: an unsupported descriptor is an error at setup, never a fallback ----
  // Pure virtual on purpose: every backend states what it can run (shape limits, precisions
  // the hardware or library offers) instead of inheriting a "yes" it may not mean. A layer's
  // Setup throws UnsupportedError when the answer is false; conformance tests skip the case.
  virtual bool Supports(const Conv2dDesc& d) const = 0;
  virtual bool Supports(const LinearDesc& d) const = 0;
  // The planned ops' descriptors (PlanDesc): pure virtual too.
  virtual bool Supports(const PlanDesc& d) const = 0;
  bool Supports(const PoolDesc& d) const { return Supports(PlanDesc{d}); }
  // A fusion, not an op a model needs: a backend without it answers no and the graph runs the
  // convolution and the pool as two ops.
  virtual bool Supports(const ConvPoolDesc& /*d*/) const { return false; }
  // Batch norm runs everywhere; its options beyond that (BatchNormArgs::dx_bf16, y_bf16) where the
  // backend says so.
  virtual bool Supports(const BatchNormArgs& a) const {
    return !a.dx_bf16 && !a.y_bf16 && !a.x_bf16;
  }

  // ---- conv2d: x (N,C,H,W), w (K,C,R,S), b (K), y (N,K,P,Q) ----
  virtual std::shared_ptr<OpPlan> PrepareConv2d(const Conv2dDesc& d) = 0;
  virtual void Conv2dForward(const OpPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                             Tensor* y) = 0;
  virtual void Conv2dBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                  Tensor* dx) = 0;
  virtual void Conv2dBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                     Tensor* dw, Tensor* db, bool accumulate) = 0;
  // Both backward passes on one dy, weights first, then data unless dx is null (a first layer
  // needs no input gradient): what Conv2d::Backward calls. The results are exactly those of the
  // two calls above (the default makes them). x and w must hold the values they had when they
  // went through Conv2dForward for this batch (as any correct gradient needs), so a backend may
  // reuse what it did with them then and share work between the two passes: the CPU backend
  // reuses the forward's copies of x and w in oneDNN's layouts when the plan's last forward made
  // them from these very tensors, and converts dy once instead of twice.
  virtual void Conv2dBackward(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                              const Tensor& w, Tensor* dx, Tensor* dw, Tensor* db, bool accumulate);

  // ---- linear: y = x W^T + b ----
  virtual std::shared_ptr<OpPlan> PrepareLinear(const LinearDesc& d) = 0;
  virtual void LinearForward(const OpPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                             Tensor* y) = 0;
  virtual void LinearBackwardData(const OpPlan& plan, const Tensor& dy, const Tensor& w,
                                  Tensor* dx) = 0;
  virtual void LinearBackwardWeights(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                                     Tensor* dw, Tensor* db, bool accumulate) = 0;
  // Both backward passes, as Conv2dBackward (same contract): what Linear::Backward calls.
  virtual void LinearBackward(const OpPlan& plan, const Tensor& x, const Tensor& dy,
                              const Tensor& w, Tensor* dx, Tensor* dw, Tensor* db, bool accumulate);

  // ---- the planned op-generic entry: a descriptor (PlanDesc) planned once per shape (a cached
  // plan: an algorithm, a workspace size), then any of the family's ops (PlannedOp, core/ops.h)
  // run with that plan. A backend implements the two with a case per alternative
  // (core/op_dispatch.h); the named methods below are shorthands. ----
  virtual std::shared_ptr<OpPlan> Prepare(const PlanDesc& d) = 0;
  virtual void Run(const OpPlan& plan, const PlannedOp& op) = 0;

  // ---- pooling: `ws` (plan.workspace_bytes, u8) is written in training forward, read in
  // backward; pass nullptr for inference. ----
  std::shared_ptr<OpPlan> PreparePool(const PoolDesc& d) { return Prepare(PlanDesc{d}); }
  void PoolForward(const OpPlan& plan, const Tensor& x, Tensor* y, Tensor* ws) {
    Run(plan, op::PoolForward{x, y, ws});
  }
  void PoolBackward(const OpPlan& plan, const Tensor& dy, const Tensor* ws, Tensor* dx) {
    Run(plan, op::PoolBackward{dy, ws, dx});
  }

  // ---- convolution + ReLU + 2x2 max pool (ConvPoolDesc), where Supports says yes ----
  // y: the pooled output (N, K, P/2, Q/2). ws: (N, K, P/2, Q/2) u8, written in training (nullptr
  // for inference): which of the window's four positions (row-major) held the maximum in bits
  // 0-1, bit 2 set where the ReLU passed it (y > 0). The same values as Conv2dForward then
  // PoolForward, up to the rounding of the convolution's sums (and so, where two window values
  // come within it, which of them is the maximum).
  void ConvPoolForward(const ConvPoolDesc& d, const Tensor& x, const Tensor& w, const Tensor* b,
                       Tensor* y, Tensor* ws) {
    Run(op::ConvPoolForward{d, x, w, b, y, ws});
  }
  // dy: the pooled output's gradient; y, ws: the forward's. Gates dy by y > 0 (the ReLU: ws's
  // bit 2; the CPU backend does not read y), then the convolution's weight and bias gradients as
  // PoolBackward then Conv2dBackwardWeights would give them (added to dw, db when accumulating),
  // up to rounding.
  void ConvPoolBackward(const ConvPoolDesc& d, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& ws, Tensor* dw, Tensor* db, bool accumulate) {
    Run(op::ConvPoolBackward{d, x, y, dy, ws, dw, db, accumulate});
  }

  // ---- elementwise ----
  void ReluForward(const Tensor& x, Tensor* y) { Run(op::Relu{x, y}); }
  void ReluBackward(const Tensor& y, const Tensor& dy, Tensor* dx) {
    Run(op::ReluBackward{y, dy, dx});
  }
  // Clip, sigmoid, hard sigmoid, hard swish, tanh (ew::Activation); backward reads both the
  // forward input x and output y. y and dx must not alias x.
  void ActivationForward(const ew::Activation& f, const Tensor& x, Tensor* y) {
    Run(op::Activation{f, x, y});
  }
  void ActivationBackward(const ew::Activation& f, const Tensor& x, const Tensor& y,
                          const Tensor& dy, Tensor* dx) {
    Run(op::ActivationBackward{f, x, y, dy, dx});
  }
  void Add(const Tensor& a, const Tensor& b, Tensor* y) { Run(op::Add{a, b, y}); }  // may alias
  // y = max(a + b, 0): a residual sum with the ReLU that alone reads it folded in (the same bits
  // as Add then ReluForward). y may alias a or b.
  void AddRelu(const Tensor& a, const Tensor& b, Tensor* y) { Run(op::AddRelu{a, b, y}); }
  // x seen as (rows, cols) with rows = s.numel(): y[r, j] = x[r, j] * s[r]. cols = 1 is the
  // elementwise product; s of shape (N, C, 1, 1) against x (N, C, H, W) is the channel scaling
  // of a squeeze-and-excitation block. y may alias x.
  void MulRows(const Tensor& x, const Tensor& s, Tensor* y) { Run(op::MulRows{x, s, y}); }
  // ds[r] = sum_j dy[r, j] * x[r, j] with rows = ds.numel(): MulRows's gradient for s.
  void RowDot(const Tensor& dy, const Tensor& x, Tensor* ds) { Run(op::RowDot{dy, x, ds}); }
  // As MulRows with a sum: y[r, j] = x[r, j] + s[r] (a (N, C, 1, 1) tensor added to every
  // position of its channel). y may alias x.
  void AddRows(const Tensor& x, const Tensor& s, Tensor* y) { Run(op::AddRows{x, s, y}); }
  // ds[r] = sum_j dy[r, j] with rows = ds.numel(): AddRows's gradient for s.
  void RowSum(const Tensor& dy, Tensor* ds) { Run(op::RowSum{dy, ds}); }
  // Zero padding of the (H, W) planes of x (N, C, H, W) into y (N, C, H', W'): input (0, 0) lands
  // at (top, left) of y, everything else is 0. Negative offsets crop instead, so the gradient of
  // a padding is Pad2d(dy, -top, -left, dx). y must not alias x.
  void Pad2d(const Tensor& x, int64_t top, int64_t left, Tensor* y) {
    Run(op::Pad2d{x, top, left, y});
  }
  // Layout changes of an (N, C, H, W) f32 tensor (a 4-D shape, the same in x and y): y holds x's
  // values channels-last (ToChannelsLast: x NCHW in memory, y NHWC) or back (FromChannelsLast).
  // Exact (a copy). y must not alias x.
  void ToChannelsLast(const Tensor& x, Tensor* y) { Run(op::ToChannelsLast{x, y}); }
  void FromChannelsLast(const Tensor& x, Tensor* y) { Run(op::FromChannelsLast{x, y}); }
  void Scale(Tensor* t, float alpha) { Run(op::Scale{t, alpha}); }
  // Inverted dropout with a stateless mask from (seed, element index).
  void DropoutForward(const Tensor& x, float p, uint64_t seed, Tensor* y) {
    Run(op::Dropout{x, p, seed, y});
  }
  void DropoutBackward(const Tensor& dy, float p, uint64_t seed, Tensor* dx) {
    Run(op::DropoutBackward{dy, p, seed, dx});
  }

  // ---- batch norm over (N, H, W) per channel; x is (N, C) or (N, C, H, W) ----
  // Training: normalises with batch statistics, saves mean and 1/sqrt(var+eps) for backward and
  // updates running statistics (unbiased variance, as PyTorch).
  void BatchNormForwardTraining(const BatchNormArgs& a, const Tensor& x, const Tensor& gamma,
                                const Tensor& beta, Tensor* running_mean, Tensor* running_var,
                                Tensor* y, Tensor* save_mean, Tensor* save_invstd) {
    Run(op::BatchNormTraining{a, x, gamma, beta, running_mean, running_var, y, save_mean,
                              save_invstd});
  }
  void BatchNormForwardInference(const BatchNormArgs& a, const Tensor& x, const Tensor& gamma,
                                 const Tensor& beta, const Tensor& running_mean,
                                 const Tensor& running_var, Tensor* y) {
    Run(op::BatchNormInference{a, x, gamma, beta, running_mean, running_var, y});
  }
  // relu_y: the forward's output when it applied the ReLU (BatchNormArgs::relu), else nullptr;
  // dx may be that same tensor (written in place). `a` as the forward's (its nhwc is read);
  // gamma and beta as the forward's. A backend may gate dy by the ReLU recomputed from x, gamma,
  // beta and the saved statistics instead of reading relu_y, when that gives the forward's
  // output to the bit (the CPU backend does: a pass over memory less).
  void BatchNormBackward(const BatchNormArgs& a, const Tensor& x, const Tensor& dy,
                         const Tensor* relu_y, const Tensor& gamma, const Tensor& beta,
                         const Tensor& save_mean, const Tensor& save_invstd, Tensor* dx,
                         Tensor* dgamma, Tensor* dbeta, bool accumulate) {
    Run(op::BatchNormBackward{a, x, dy, relu_y, gamma, beta, save_mean, save_invstd, dx, dgamma,
                              dbeta, accumulate});
  }

  // ---- a batch norm applied by the sum that alone reads it, where DefersBatchNormApply says so --
  // A ResNet block's residual sum reads the batch norm that ends its main path, and the block's
  // input or the shortcut's batch norm. Each such batch norm computes its statistics and its
  // per-channel scale and shift (`affine`: 2 x C f32, scale then shift, as ew::BnFold gives
  // them) and writes no output; the sum applies them as it adds (AffineAdd): one pass over memory
  // for both normalisations, the sum and its folded ReLU, and no batch-norm outputs held. The
  // same bits as the batch norms' forward then Add or AddRelu. Channels-last (BatchNormArgs::nhwc)
  // only; backends without it answer no (BackendCapabilities::deferred_batch_norm).
  // BatchNormForwardTraining without y: the saved and running statistics, and `affine`.
  void BatchNormAffineTraining(const BatchNormArgs& a, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, Tensor* running_mean, Tensor* running_var,
                               Tensor* affine, Tensor* save_mean, Tensor* save_invstd) {
    Run(op::BatchNormAffineTraining{a, x, gamma, beta, running_mean, running_var, affine, save_mean,
                                    save_invstd});
  }
  // The scale and shift BatchNormForwardInference applies.
  void BatchNormAffineInference(const BatchNormArgs& a, const Tensor& gamma, const Tensor& beta,
                                const Tensor& running_mean, const Tensor& running_var,
                                Tensor* affine) {
    Run(op::BatchNormAffineInference{a, gamma, beta, running_mean, running_var, affine});
  }
  // y = f0(x0) + f1(x1), then max(., 0) with `relu`: f_k(x) = x * scale + shift per channel
  // (ew::BnApply) where affine_k is given, x itself where it is null (not both: that is Add).
  // x0, x1, y: f32 (N, C, H, W) channels-last; y must alias neither. An x_k with an affine may be
  // bf16 (BatchNormArgs::x_bf16), and y may be bf16 where WritesBf16Sums says so (the f32 y
  // rounded to nearest even).
  void AffineAdd(const Tensor& x0, const Tensor* affine0, const Tensor& x1, const Tensor* affine1,
                 bool relu, Tensor* y) {
    Run(op::AffineAdd{x0, affine0, x1, affine1, relu, y});
  }

  // ---- a gradient in two parts, where TakesGradientParts says so ----
  // An output read by two nodes (a ResNet block's input) gets the sum of their gradients. Where
  // its backward starts with one of these ops, the graph hands the op both parts instead of
  // summing them into a buffer of their own first: one pass over memory and one buffer less.
  // Each adds dy_a + dy_b elementwise in f32 as it reads them, in that order: the same bits as
  // Add(dy_a, dy_b) then the one-part op. Backends without them answer no (the graph sums;
  // BackendCapabilities::gradient_parts).
  // ReluBackward of dy_a + dy_b. dx may be y (written in place). y may be bf16 where
  // WritesBf16Sums says so, for both (dx then f32, not y). With b_stride above 1, y and dy_a are
  // channels-last and dy_b is a strided 1x1 convolution's input gradient at the pixels it reads
  // (Conv2dDesc::dx_sub): (N, C, H / b_stride, W / b_stride), zero everywhere else, where dy_a
  // is still added to that 0 (the same bits as summing the whole gradient).
  void ReluBackwardSum(const Tensor& y, const Tensor& dy_a, const Tensor& dy_b, int64_t b_stride,
                       Tensor* dx) {
    Run(op::ReluBackwardSum{y, dy_a, dy_b, b_stride, dx});
  }
  // BatchNormBackward of dy_a + dy_b; channels-last (BatchNormArgs::nhwc) only.
  void BatchNormBackwardSum(const BatchNormArgs& a, const Tensor& x, const Tensor& dy_a,
                            const Tensor& dy_b, const Tensor* relu_y, const Tensor& gamma,
                            const Tensor& beta, const Tensor& save_mean, const Tensor& save_invstd,
                            Tensor* dx, Tensor* dgamma, Tensor* dbeta, bool accumulate) {
    Run(op::BatchNormBackwardSum{a, x, dy_a, dy_b, relu_y, gamma, beta, save_mean, save_invstd, dx,
                                 dgamma, dbeta, accumulate});
  }

  // ---- losses: sums over the batch (the caller divides), written to 1-element f32 tensors ----
  // logits (N, K), labels i32 (N); probs (N, K) kept for backward; correct = argmax hits.
  // A label outside [0, K) is a DataError: the CPU backend throws here; a device backend does
  // not stall its stream to find out, it reports the error at its next call that synchronises
  // (CopyToHost, Synchronize, the checks). Callers validate labels on the host first (datasets
  // do when they open a file), so this is a backstop.
  // `label_smoothing` in [0, 1) mixes the one-hot target with the uniform one (ew::SoftmaxXentRow).
  void SoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels, float label_smoothing,
                           Tensor* probs, Tensor* loss_sum, Tensor* correct) {
    Run(op::SoftmaxCrossEntropy{logits, labels, label_smoothing, probs, loss_sum, correct});
  }
  // dlogits = (probs - smoothed onehot(labels)) * scale
  void SoftmaxCrossEntropyBackward(const Tensor& probs, const Tensor& labels, float label_smoothing,
                                   float scale, Tensor* dlogits) {
    Run(op::SoftmaxCrossEntropyBackward{probs, labels, label_smoothing, scale, dlogits});
  }
  // loss_sum = sum((y - t)^2); dy = 2 (y - t) * scale
  void MseLoss(const Tensor& y, const Tensor& t, Tensor* loss_sum) { Run(op::Mse{y, t, loss_sum}); }
  void MseBackward(const Tensor& y, const Tensor& t, float scale, Tensor* dy) {
    Run(op::MseBackward{y, t, scale, dy});
  }

  // ---- optimizer updates over flat f32 buffers (params, grads, state of equal length) ----
  void SgdStep(const ew::SgdHyper& h, Tensor* param, const Tensor& grad, Tensor* momentum) {
    Run(op::SgdStep{h, param, grad, momentum});
  }
  void AdamWStep(const ew::AdamWHyper& h, Tensor* param, const Tensor& grad, Tensor* m, Tensor* v) {
    Run(op::AdamWStep{h, param, grad, m, v});
  }

  // ---- profiling: time per op kind. Off by default. On the host (CPU) each call's wall time;
  // a backend whose ops run on a device stream times them there (TimesOpsOnDevice: a timer
  // before and after each op on the stream, nothing synchronised per op), so the step runs as
  // it would unprofiled and the ops' sum is the device's busy time. ----
  void EnableProfiling(bool on) { profiling_ = on; }
  bool profiling() const { return profiling_; }
  std::vector<OpStat> Profile();  // sorted by time, descending (waits for device timers)
  void ResetProfile();
  // The graph node whose ops run now (Graph sets it around each node; nullptr outside).
  void SetProfileNode(const std::string* node) { profile_node_ = node; }

  // ---- checks (synchronise) ----
  virtual int64_t CountNonFinite(const Tensor& t) = 0;  // f32
  // Sum of squares in double (for checksums and gradient norms).
  virtual double SumSquares(const Tensor& t) = 0;

 protected:
  explicit Backend(std::unique_ptr<CachingAllocator> allocator)
      : allocator_(std::move(allocator)) {}

  // Put `OpScope scope(this, "conv2d_fwd");` first in every op implementation.
  class OpScope {
   public:
    OpScope(Backend* be, const char* name);
    ~OpScope();
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;
    // The op's floating-point operations, for the profile's GFLOP/s.
    void set_flops(double flops) { flops_ = flops; }

   private:
    Backend* be_;
    const char* name_;
    int64_t start_ns_ = 0;
    int64_t timer_ = -1;  // the device timer, when the backend times ops on the device
    double flops_ = 0;
  };

  // Device timers for the profile (TimesOpsOnDevice backends). StartDeviceTimer marks the stream
  // before an op and returns a token; StopDeviceTimer marks it after the op and adds the time
  // between the two marks to stat->seconds once the device has passed them (at the latest in
  // FlushDeviceTimers). Stop never throws (a timer that fails is dropped). stat stays valid until
  // FlushDeviceTimers returns.
  virtual int64_t StartDeviceTimer() { return -1; }
  virtual void StopDeviceTimer(int64_t /*token*/, OpStat* /*stat*/) noexcept {}
  virtual void FlushDeviceTimers() {}
  // Forgets the stats of timers that FlushDeviceTimers could not read yet (ResetProfile).
  virtual void DropDeviceTimers() noexcept {}

  // Configure's work: acts on the options in `next` that this backend has, compared with
  // options() (still the previous ones).
  virtual void ApplyOptions(const BackendOptions& /*next*/) {}

 private:
  template <class T>
  void Set(T BackendOptions::*field, T value) {
    BackendOptions next = options_;
    next.*field = value;
    Configure(next);
  }

  std::unique_ptr<CachingAllocator> allocator_;
  BackendOptions options_;
  bool profiling_ = false;
  const std::string* profile_node_ = nullptr;
  std::map<std::pair<std::string, std::string>, OpStat> stats_;  // by (node, op)
};

// Backend::SetCpuFusions(on) for a scope; back on (the default) when it ends, by exception too.
class ScopedCpuFusions {
 public:
  ScopedCpuFusions(Backend& be, bool on) : be_(be) { be_.SetCpuFusions(on); }
  ~ScopedCpuFusions() { be_.SetCpuFusions(true); }
  ScopedCpuFusions(const ScopedCpuFusions&) = delete;
  ScopedCpuFusions& operator=(const ScopedCpuFusions&) = delete;

 private:
  Backend& be_;
};

}  // namespace dptrain
