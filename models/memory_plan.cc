// SPDX-License-Identifier: Apache-2.0
// Memory planning from a set-up model: parameters from the named tensors, activations and
// workspaces from the layers, plan-held buffers counted once per distinct plan.
#include "models/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "core/memory/caching_allocator.h"

namespace dptrain {

int64_t ShardedGradScratchFloats(const std::vector<std::pair<int64_t, int64_t>>& groups,
                                 int world) {
  if (groups.empty() || world <= 1) return 0;
  const int64_t flat = groups.back().second;
  const int64_t saving = flat - flat / world;  // groups are padded to whole chunks per rank
  int64_t peak = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const int64_t one = groups[i].second - groups[i].first;
    if (one > saving) return -1;
    int64_t pair = one;
    if (i + 1 < groups.size()) pair += groups[i + 1].second - groups[i + 1].first;
    peak = std::max(peak, pair <= saving ? pair : one);
  }
  return peak;
}

MemoryPlan PlanMemory(Model& m, int optimizer_slots, LossKind loss, int64_t budget,
                      const StateSharding& shard) {
  MemoryPlan plan;
  const int64_t ways = std::max(shard.ranks, 1);
  // "gradients" that would peak above "optimizer" runs as "optimizer": the model kept its flat
  // gradient buffer (FlatLayout::keep_flat_grads).
  const bool grads_sharded = shard.grads && ways > 1 && !m.grads().defined();
  const int64_t opt_ways = shard.optimizer || shard.grads ? ways : 1;
  const int64_t grad_ways = grads_sharded ? ways : 1;
  if (grads_sharded) {
    plan.shard = "gradients";
  } else if (ways > 1 && shard.grads) {
    plan.shard = "gradients, run as optimizer";
  } else if (ways > 1 && shard.optimizer) {
    plan.shard = "optimizer";
  }
  plan.micro_batch = m.max_batch();
  const int64_t b = plan.micro_batch;
  std::set<const OpPlan*> seen;
  int64_t fixed = 0, per_sample = 0;
  const Graph& net = m.net();
  for (size_t i = 0; i < net.size(); ++i) {
    Layer& l = net.layer(i);
    LayerMemory lm;
    lm.type = l.type();
    lm.name = net.node_name(i).empty() ? fmt::format("{} #{}", lm.type, i) : net.node_name(i);
    std::vector<ParamRef> refs;
    l.ListParams(&refs);
    for (const auto& r : refs) {
      // Aligned like the flat buffer (16 floats).
      const int64_t bytes = (r.shape.numel() + 15) / 16 * 16 * 4;
      lm.params += bytes;
      lm.grads += bytes / grad_ways;
      lm.optimizer += optimizer_slots * bytes / opt_ways;
    }
    std::vector<ParamRef> bufs;
    l.ListBuffers(&bufs);
    for (const auto& r : bufs) lm.params += (r.shape.numel() + 15) / 16 * 16 * 4;
    lm.activations = net.OwnBytesPerSample(i) * b;
    lm.workspace = l.WorkspaceBytes();
    std::vector<const OpPlan*> plans;
    l.ListPlans(&plans);
    for (const OpPlan* p : plans) {
      if (p != nullptr && seen.insert(p).second)
        lm.workspace += static_cast<int64_t>(p->held_bytes);
    }
    fixed += lm.params + lm.grads + lm.optimizer;
    // Plan staging buffers are activation-sized: they grow with the batch.
    per_sample += (lm.activations + lm.workspace) / std::max<int64_t>(b, 1);
    plan.layers.push_back(lm);
  }
  if (net.InputGradBytesPerSample() > 0) {  // Graph::set_share_input_grads
    LayerMemory lm;
    lm.name = "input gradients";
    lm.type = "shared";
    lm.activations = net.InputGradBytesPerSample() * b;
    per_sample += net.InputGradBytesPerSample();
    plan.layers.push_back(lm);
  }
  if (net.OutputBytesPerSample() > 0) {  // Graph::set_recompute
    LayerMemory lm;
    lm.name = fmt::format("activations ({} segments)", net.recompute_segments());
    lm.type = "recomputed";
    lm.activations = net.OutputBytesPerSample() * b;
    per_sample += net.OutputBytesPerSample();
    plan.layers.push_back(lm);
  }
  const int64_t outputs = m.output_shape().numel() / std::max<int64_t>(b, 1);
  const int64_t input = m.input_shape().numel();
  // Input batch (+ labels or targets), loss probabilities and output gradient.
  const int64_t other_per_sample = 4 * (input + 1) +
                                   4 * outputs * (loss == LossKind::kCrossEntropy ? 2 : 1) +
                                   (loss == LossKind::kMse ? 4 * outputs : 0);
  const int64_t shared = static_cast<int64_t>(m.backend().SharedWorkspaceBytes());
  if (grads_sharded) {
    // A group's scratch lives from its first layer's backward until its reduce-scatter is
    // done: with the next group's, while both fit in what the mode saves.
    plan.grad_scratch = 4 * std::max<int64_t>(ShardedGradScratchFloats(m.groups(), shard.ranks), 0);
  }
  plan.other = other_per_sample * b + shared;
  plan.fixed = fixed + shared + plan.grad_scratch;
  plan.per_sample = per_sample + other_per_sample;
  plan.total = plan.fixed + plan.per_sample * b;
  plan.budget = budget;
  if (budget > 0 && plan.per_sample > 0) {
    // Blocks are rounded up by the caching allocator; keep 5% headroom for that.
    const double usable = static_cast<double>(budget) * 0.95 - static_cast<double>(plan.fixed);
    plan.max_micro_batch =
        usable > 0 ? static_cast<int64_t>(usable / static_cast<double>(plan.per_sample)) : 0;
  }
  return plan;
}

int64_t MemoryPlan::Sum(int64_t LayerMemory::*field) const {
  int64_t n = 0;
  for (const auto& l : layers) n += l.*field;
  return n;
}

std::string MemoryPlan::ToTable() const {
  auto mb = [](int64_t v) { return fmt::format("{:.2f}", static_cast<double>(v) / (1 << 20)); };
  // The first column fits the longest node name (ONNX names such as
  // /features/features.3/expand3x3/Conv), 22 at least.
  size_t w = 22;
  for (const auto& l : layers) w = std::max(w, l.name.size());
  std::string s = fmt::format("memory per rank at micro-batch {} ({}, dist.shard = {}), MiB:\n",
                              micro_batch, precision, shard);
  s += fmt::format("{:<{}} {:<11} {:>9} {:>9} {:>9} {:>11} {:>10} {:>9}\n", "layer", w, "type",
                   "params", "grads", "optim", "activations", "workspace", "total");
  for (const auto& l : layers) {
    s += fmt::format("{:<{}} {:<11} {:>9} {:>9} {:>9} {:>11} {:>10} {:>9}\n", l.name, w, l.type,
                     mb(l.params), mb(l.grads), mb(l.optimizer), mb(l.activations), mb(l.workspace),
                     mb(l.total()));
  }
  if (grad_scratch > 0) {
    s += fmt::format("{:<{}} {:<11} {:>61}\n", "gradient groups", w, "in flight", mb(grad_scratch));
  }
  s += fmt::format("{:<{}} {:<11} {:>61}\n", "other", w, "inputs/loss", mb(other));
  s += fmt::format("{:<{}} {:<11} {:>61}\n", "total", w, "", mb(total));
  s += fmt::format("fixed {} MiB + {:.1f} KiB per sample\n", mb(fixed),
                   static_cast<double>(per_sample) / 1024);
  if (budget > 0 && winograd_direct_total > 0) {
    s += fmt::format(
        "budget {}: the largest micro-batch that fits is {} with train.winograd's buffers, {} "
        "with direct convolutions (training gives Winograd up first)\n",
        FormatBytes(static_cast<size_t>(budget)), max_micro_batch, winograd_direct_max_micro_batch);
  } else if (budget > 0) {
    s += fmt::format("budget {}: the largest micro-batch that fits is {}\n",
                     FormatBytes(static_cast<size_t>(budget)), max_micro_batch);
  }
  return s;
}

std::string MemoryPlan::ToJson() const {
  std::string s = fmt::format(
      "{{\"micro_batch\": {}, \"precision\": \"{}\", \"shard\": \"{}\", \"total_bytes\": {}, "
      "\"fixed_bytes\": {}, \"per_sample_bytes\": {}, \"grad_scratch_bytes\": {}, "
      "\"other_bytes\": {}, \"budget_bytes\": {}, \"max_micro_batch\": {}, "
      "\"winograd_direct_total_bytes\": {}, \"winograd_direct_max_micro_batch\": {}, "
      "\"layers\": [",
      micro_batch, precision, shard, total, fixed, per_sample, grad_scratch, other, budget,
      max_micro_batch, winograd_direct_total, winograd_direct_max_micro_batch);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& l = layers[i];
    s += fmt::format(
        "{}{{\"name\": \"{}\", \"type\": \"{}\", \"params\": {}, \"grads\": {}, "
        "\"optimizer\": {}, \"activations\": {}, \"workspace\": {}, \"total\": {}}}",
        i ? ", " : "", l.name, l.type, l.params, l.grads, l.optimizer, l.activations, l.workspace,
        l.total());
  }
  return s + "]}";
}

}  // namespace dptrain
