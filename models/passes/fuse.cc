// SPDX-License-Identifier: Apache-2.0
// The fusion pass, before Setup, on the graph's structure only: which layer applies a ReLU, which
// max pool takes a ReLU's backward gate, which convolution and 2x2 max pool may run as one op,
// which batch norms the residual sum that reads them may apply, and who would hand whom a bf16
// tensor (decided at Setup: choose.cc). Every fusion here gives the same numbers as the layers
// unfused (tests/unit/model_test.cc proves each, with Graph::set_fold off as the reference).
#include <algorithm>

#include "models/graph.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/join.h"
#include "models/layers/pool.h"
#include "models/layers/relu.h"
#include "models/passes/passes.h"

namespace dptrain {

GraphPasses::GraphPasses(const Graph& graph, Backend& backend)
    : graph_(graph), backend_(backend), readers_(graph.size(), 0), offers_(graph.size()) {
  for (size_t i = 0; i < graph_.size(); ++i) {
    for (int j : graph_.inputs(i)) {
      if (j != Graph::kInput) ++readers_[static_cast<size_t>(j)];
    }
  }
  if (!readers_.empty()) ++readers_.back();
}

int GraphPasses::Applier(int i) const {
  // relu_into is kNone for a ReLU that is not folded.
  if (dynamic_cast<Relu*>(&graph_.layer(static_cast<size_t>(i))) == nullptr) return i;
  return offers_[static_cast<size_t>(i)].relu_into;
}

namespace {

// Has `l` apply the ReLU that alone reads its output (max(y, 0) written by its forward, its
// gradient gated by that output in its backward) where it can: a convolution, a batch norm, a
// residual sum. Whether it does.
bool ApplyRelu(Layer& l) {
  if (auto* c = dynamic_cast<Conv2d*>(&l)) return c->fusion().relu = true;
  if (auto* b = dynamic_cast<BatchNorm*>(&l)) return b->fusion().relu = true;
  if (auto* a = dynamic_cast<Add*>(&l)) return a->fusion().relu = true;
  return false;
}

}  // namespace

void GraphPasses::Fuse(bool fold) {
  const size_t count = graph_.size();
  // Every descriptor from scratch (Setup may run more than once on one graph).
  for (size_t i = 0; i < count; ++i) {
    Layer& l = graph_.layer(i);
    if (auto* c = dynamic_cast<Conv2d*>(&l)) c->fusion() = Conv2dFusion{};
    if (auto* b = dynamic_cast<BatchNorm*>(&l)) b->fusion() = BatchNormFusion{};
    if (auto* r = dynamic_cast<Relu*>(&l)) r->fusion() = ReluFusion{};
    if (auto* p = dynamic_cast<Pool2d*>(&l)) p->fusion() = Pool2dFusion{};
    if (auto* a = dynamic_cast<Add*>(&l)) a->fusion() = AddFusion{};
  }
  // The one-input node i's producer, which only node i reads, or kNone.
  const auto sole_producer = [&](size_t i) {
    const std::vector<int>& in = graph_.inputs(i);
    if (in.size() != 1 || in[0] == Graph::kInput) return kNone;
    return readers_[static_cast<size_t>(in[0])] == 1 ? in[0] : kNone;
  };
  // A batch norm offers the convolution before it to write that output in bf16
  // (Conv2dDesc::y_bf16): a choice of precision (the rounding cuDNN and PyTorch's autocast apply
  // to a bf16 convolution's output), not a fusion, so a model without folding makes it too.
  for (size_t i = 0; i < count; ++i) {
    const int p = sole_producer(i);
    if (p != kNone && dynamic_cast<BatchNorm*>(&graph_.layer(i)) != nullptr &&
        dynamic_cast<Conv2d*>(&graph_.layer(static_cast<size_t>(p))) != nullptr)
      offers_[static_cast<size_t>(p)].y_reader = static_cast<int>(i);
  }
  if (!fold) return;
  // Node by node (a ReLU's folding is known before its readers'), each one-input node and the
  // producer only it reads. Not the last node: the model's output is not a folded producer's,
  // which gates its gradient over its own output (a view of one, through a flatten at the end,
  // still is: Model::Forward's output is read before Backward).
  for (size_t i = 0; i + 1 < count; ++i) {
    const int p = sole_producer(i);
    if (p == kNone) continue;
    Layer& l = graph_.layer(i);
    Layer& producer = graph_.layer(static_cast<size_t>(p));
    if (auto* relu = dynamic_cast<Relu*>(&l)) {
      // The producer applies the ReLU; this one passes its input and gradient through.
      if (ApplyRelu(producer)) {
        relu->fusion().folded = true;
        offers_[i].relu_into = p;
      }
    } else if (dynamic_cast<Conv2d*>(&l) != nullptr) {
      // A bf16 convolution offers to read its input in bf16 (Conv2dDesc::x_bf16) to the batch
      // norm or convolution that writes it (through a ReLU folded into one).
      const int w = Applier(p);
      if (w != kNone &&
          (dynamic_cast<BatchNorm*>(&graph_.layer(static_cast<size_t>(w))) != nullptr ||
           dynamic_cast<Conv2d*>(&graph_.layer(static_cast<size_t>(w))) != nullptr))
        offers_[static_cast<size_t>(w)].y_reader = static_cast<int>(i);
    } else if (dynamic_cast<BatchNorm*>(&l) != nullptr) {
      // A convolution's batch norm offers to write its gradient in bf16 (Conv2dDesc::dy_bf16).
      if (dynamic_cast<Conv2d*>(&producer) != nullptr)
        offers_[static_cast<size_t>(p)].dy_writer = static_cast<int>(i);
    } else if (auto* pool = dynamic_cast<Pool2d*>(&l);
               pool != nullptr && pool->kind() == PoolKind::kMax) {
      // The max pool takes over the ReLU's backward gate (Pool2dFusion::gate_relu) from the ReLU
      // layer, or from the layer it is folded into.
      int g = p;  // the layer applying the ReLU
      bool gate = false;
      if (auto* r = dynamic_cast<Relu*>(&producer); r != nullptr && !r->folded()) {
        r->fusion().gate_handed = gate = true;
      } else {
        g = Applier(p);
        Layer& gl = graph_.layer(static_cast<size_t>(g));
        if (auto* c = dynamic_cast<Conv2d*>(&gl)) gate = c->fusion().gate_handed = c->fusion().relu;
        if (auto* b = dynamic_cast<BatchNorm*>(&gl))
          gate = b->fusion().gate_handed = b->fusion().relu;
      }
      pool->fusion().gate_relu = gate;
      // A 2x2 max pool after a convolution's ReLU offers to run both as one op (ConvPoolDesc),
      // and to write the convolution's gradient in bf16.
      const bool two_by_two =
          pool->kernel() == 2 && (pool->stride() == 2 || pool->stride() == 0) && pool->pad() == 0;
      auto* conv = dynamic_cast<Conv2d*>(&graph_.layer(static_cast<size_t>(g)));
      if (!gate || !two_by_two || conv == nullptr) continue;
      Offers& o = offers_[static_cast<size_t>(g)];
      o.pool_offered = true;
      o.pool = PoolDesc{};
      o.pool.kind = PoolKind::kMax, o.pool.kernel = 2, o.pool.stride = 2, o.pool.pad = 0;
      o.pool.ceil_mode = pool->ceil_mode();
      o.dy_writer = static_cast<int>(i);
      pool->fusion().conv = conv;
    }
  }
  // A residual sum applies a batch norm whose output only it reads, where the batch norm defers
  // it (BatchNormFusion::deferred, decided at Setup).
  for (size_t i = 0; i < count; ++i) {
    auto* add = dynamic_cast<Add*>(&graph_.layer(i));
    const std::vector<int>& in = graph_.inputs(i);
    if (add == nullptr || in.size() != 2) continue;
    for (size_t k = 0; k < 2; ++k) {
      if (in[k] == Graph::kInput || readers_[static_cast<size_t>(in[k])] != 1) continue;
      auto* bn = dynamic_cast<BatchNorm*>(&graph_.layer(static_cast<size_t>(in[k])));
      if (bn == nullptr) continue;
      offers_[static_cast<size_t>(in[k])].defer_offered = true;
      add->fusion().applies[k] = bn;
    }
  }
  // An output that several layers read, each of them a convolution that would read it in bf16 (a
  // ResNet block's output, read by the next block's convolution and shortcut): offered to the
  // residual sum that writes it (through its folded ReLU).
  for (size_t j = 0; j + 1 < count; ++j) {
    if (readers_[j] < 2) continue;
    std::vector<int> readers;
    for (size_t i = 0; i < count; ++i) {
      const std::vector<int>& in = graph_.inputs(i);
      if (in.size() == 1 && in[0] == static_cast<int>(j)) readers.push_back(static_cast<int>(i));
    }
    const bool all =
        static_cast<int>(readers.size()) == readers_[j] &&
        std::all_of(readers.begin(), readers.end(), [&](int r) {
          return dynamic_cast<Conv2d*>(&graph_.layer(static_cast<size_t>(r))) != nullptr &&
                 !offers_[static_cast<size_t>(r)].pool_offered;
        });
    const int w = Applier(static_cast<int>(j));
    if (all && w != kNone && dynamic_cast<Add*>(&graph_.layer(static_cast<size_t>(w))) != nullptr)
      offers_[static_cast<size_t>(w)].y_readers = readers;
  }
}

}  // namespace dptrain
