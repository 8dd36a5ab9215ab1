// SPDX-License-Identifier: Apache-2.0
// The graph's passes: what runs where, decided once the graph is built, from its structure, the
// shapes and the backend's capabilities, and written into each layer's descriptor (Conv2dFusion,
// BatchNormFusion, ReluFusion, Pool2dFusion, AddFusion) before that layer's Setup. A layer runs
// what its descriptor says; no layer asks another anything. Graph::Setup runs them in order:
//   fuse.cc    structure only: ReLUs folded into the convolution, batch norm or residual sum
//              before them, a max pool taking a ReLU's backward gate, a convolution and 2x2 max
//              pool offered as one op, batch norms applied by the residual sum that reads them,
//              and who would hand whom a bf16 tensor;
//   layout.cc  channels-last regions (which outputs are NHWC);
//   choose.cc  node by node as the graph sets them up, once a node's input shapes are known:
//              which of those offers the backend runs (Backend::Supports of the fused or 16-bit
//              descriptor), the sampled input gradient of a strided shortcut, a max pool writing
//              NCHW for the flatten after it, and a broadcast sum refusing channels-last.
// docs/adding-ops.md says how to add a fusion.
#pragma once

#include <cstddef>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "models/layer.h"

namespace dptrain {

class Graph;

// Thrown by GraphPasses::Choose when a node planned with channels-last inputs cannot take them
// once their shapes are known (a broadcast sum): the graph then plans the layouts again with that
// node on NCHW, and sets every node up again.
struct NhwcRefused {};

class GraphPasses {
 public:
  GraphPasses(const Graph& graph, Backend& backend);

  // fuse.cc, before Setup. `fold` off: only the choices of precision that are not fusions (a
  // convolution's bf16 output for the batch norm that alone reads it); the tests that prove
  // folding changes no number turn it off.
  void Fuse(bool fold);

  // layout.cc: which node outputs are channels-last, with the nodes in `refused` taking NCHW
  // inputs only (a node found taking inputs of both layouts is added to it). All NCHW where `on`
  // is false or the backend does not keep channels-last activations.
  std::vector<char> PlanLayouts(bool on, std::vector<char>* refused) const;

  // choose.cc, at node i's Setup, its inputs set up: `in` their shapes, `opts` the node's options
  // (nhwc_out from the layout plan; may be turned off, with *nhwc, for a max pool that writes
  // NCHW for the flattens that read it). Writes the node's descriptor; may throw NhwcRefused.
  void Choose(size_t i, const std::vector<Shape>& in, bool* nhwc, SetupOptions* opts);

 private:
  static constexpr int kNone = -1;
  // What fuse.cc found for a node, which Choose turns into descriptors.
  struct Offers {
    int y_reader = kNone;        // the one node that would read this output in bf16
    std::vector<int> y_readers;  // a sum's: the convolutions that each would read it in bf16
    int dy_writer = kNone;       // a convolution's: the batch norm or pool that writes its dy
    int relu_into = kNone;       // a ReLU's: the node it is folded into
    bool pool_offered = false;   // a convolution's: the 2x2 max pool after it offers one op
    PoolDesc pool;               // ... its descriptor, without the shapes
    bool defer_offered = false;  // a batch norm's: the sum that alone reads it may apply it
  };

  // Layouts (layout.cc): whether node i's layer runs on channels-last inputs (and then writes a
  // channels-last output unless it chooses), chooses its output's layout whatever its inputs'
  // (a convolution, a global pool, a flatten), or pays a transpose for a channels-last input (a
  // flatten).
  bool TakesNhwc(size_t i) const;
  bool ChoosesNhwcOut(size_t i) const;
  bool ReadersPreferNchw(size_t i) const;
  // Whether the max pool at node i can write its output NCHW from its channels-last input `in`.
  bool CanWriteNchwFromNhwc(size_t i, const Shape& in) const;

  // Precision hand-offs (choose.cc): whether node r would read an input of shape `in` in bf16,
  // whether node w would write the gradient of its input `in` in bf16, and telling node r it does.
  bool CanReadBf16Input(int r, const Shape& in, bool nhwc, Precision p) const;
  bool CanWriteBf16Dx(int w, const Shape& in, bool nhwc) const;
  void ReadBf16Input(int r, bool bf16);
  // The node whose layer computes node i's output: i itself, or, for a ReLU folded into the
  // layer before it, that layer's node (kNone for a ReLU layer not folded).
  int Applier(int i) const;

  void ChooseConv(size_t i, const Shape& in, const SetupOptions& opts);
  void ChooseBatchNorm(size_t i, const Shape& in, const SetupOptions& opts);
  void ChoosePool(size_t i);
  void ChooseAdd(size_t i, const std::vector<Shape>& in, const SetupOptions& opts);

  const Graph& graph_;
  Backend& backend_;
  std::vector<int> readers_;  // per node: nodes reading its output (+1 for the graph's output)
  std::vector<Offers> offers_;
};

}  // namespace dptrain
