// SPDX-License-Identifier: Apache-2.0
// The layout pass: which activations are channels-last (NHWC) on a backend that keeps them so
// (BackendCapabilities::channels_last). A node's output is NHWC when the node chooses its
// output's layout (a convolution, a global pool, a flatten) and every reader takes NHWC inputs,
// or when the node takes NHWC inputs (batch norm, pooling, the elementwise layers) and is given
// them; the graph's input and output are NCHW (a global pool's (N, C, 1, 1) output is both).
#include <algorithm>

#include "models/graph.h"
#include "models/layers/activation.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/flatten.h"
#include "models/layers/join.h"
#include "models/layers/pool.h"
#include "models/layers/relu.h"
#include "models/passes/passes.h"

namespace dptrain {

bool GraphPasses::TakesNhwc(size_t i) const {
  const Layer& l = graph_.layer(i);
  return dynamic_cast<const Conv2d*>(&l) != nullptr ||
         dynamic_cast<const BatchNorm*>(&l) != nullptr ||
         dynamic_cast<const Pool2d*>(&l) != nullptr || dynamic_cast<const Relu*>(&l) != nullptr ||
         dynamic_cast<const Activation*>(&l) != nullptr ||
         dynamic_cast<const Flatten*>(&l) != nullptr || dynamic_cast<const Add*>(&l) != nullptr;
}

bool GraphPasses::ChoosesNhwcOut(size_t i) const {
  const Layer& l = graph_.layer(i);
  const auto* pool = dynamic_cast<const Pool2d*>(&l);
  return dynamic_cast<const Conv2d*>(&l) != nullptr ||
         dynamic_cast<const Flatten*>(&l) != nullptr || (pool != nullptr && pool->kernel() == 0);
}

bool GraphPasses::ReadersPreferNchw(size_t i) const {
  // A flatten pays a transpose for a channels-last input that an NCHW one does not.
  bool any = false;
  for (size_t k = i + 1; k < graph_.size(); ++k) {
    for (int j : graph_.inputs(k)) {
      if (j != static_cast<int>(i)) continue;
      if (dynamic_cast<const Flatten*>(&graph_.layer(k)) == nullptr) return false;
      any = true;
    }
  }
  return any;
}

std::vector<char> GraphPasses::PlanLayouts(bool on, std::vector<char>* refused) const {
  const size_t count = graph_.size();
  std::vector<char> nhwc(count, 0);
  if (!on || !backend_.capabilities().channels_last) return nhwc;
  std::vector<std::vector<size_t>> readers(count);
  for (size_t i = 0; i < count; ++i) {
    for (int j : graph_.inputs(i)) {
      if (j != Graph::kInput) readers[static_cast<size_t>(j)].push_back(i);
    }
  }
  const auto takes = [&](size_t i) { return !(*refused)[i] && TakesNhwc(i); };
  const auto chooses = [&](size_t i) { return ChoosesNhwcOut(i); };
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
      if (chooses(i)) {
        nhwc[i] = ok[i];
        continue;
      }
      size_t nhwc_inputs = 0;
      const std::vector<int>& in = graph_.inputs(i);
      for (int j : in) nhwc_inputs += j != Graph::kInput && nhwc[static_cast<size_t>(j)];
      nhwc[i] = nhwc_inputs > 0 ? 1 : 0;
      if (nhwc_inputs > 0 && nhwc_inputs < in.size()) {
        (*refused)[i] = 1;
        mixed = true;
      }
    }
    if (!mixed) return nhwc;
    std::fill(nhwc.begin(), nhwc.end(), 0);
  }
}

bool GraphPasses::CanWriteNchwFromNhwc(size_t i, const Shape& in) const {
  auto* pool = dynamic_cast<Pool2d*>(&graph_.layer(i));
  if (pool == nullptr || in.rank() != 4) return false;
  // Fused with the convolution before it, the pool writes that op's layout.
  const Conv2d* conv = pool->fusion().conv;
  if (conv != nullptr && conv->pool_fused() != nullptr) return false;
  PoolDesc d = pool->DescFor(in, true, true);
  d.dx_bf16 = conv != nullptr && conv->reads_dy_bf16();  // as Choose will decide
  return d.y_nchw && d.Valid() && backend_.Supports(d);
}

}  // namespace dptrain
