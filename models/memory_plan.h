// SPDX-License-Identifier: Apache-2.0
// `dptrain plan`: the device memory one rank needs, per layer (parameters, gradients, optimizer
// state, activations, workspaces) and in total, at a micro-batch and precision, and the largest
// micro-batch that fits a budget. Computed from a model set up at that micro-batch, so it counts
// what the layers and the backend's plans really allocate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/loss.h"
#include "models/model.h"

namespace dptrain {

struct LayerMemory {
  std::string name;  // top-level layer name ("conv1") or "<type> #<index>" when unnamed
  std::string type;
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0;  // bytes
  int64_t total() const { return params + grads + optimizer + activations + workspace; }
};

// Sharded data parallelism (dist.shard) over `ranks`: the optimizer state, and with `grads` the
// gradients, are 1/ranks per rank; with `grads`, each gradient group also needs a full-size
// scratch buffer while backward writes it and its reduce-scatter runs (the model must be set up
// with the sharded FlatLayout, whose groups() the plan reads).
struct StateSharding {
  int ranks = 1;
  bool optimizer = false, grads = false;
};

// dist.shard = "gradients" on `world` ranks, for a model set up with its groups (Model::groups(),
// in backward order): the most gradient scratch, in floats, that the sharded reducer holds at
// once. The mode saves the flat gradient buffer less this rank's shard of it; two neighbouring
// groups' scratch (one being written, the one before it being reduced) overlap only while they
// fit in that saving, else the reducer waits for the older one first. -1 when even one group's
// scratch is more than the saving: the mode would peak above "optimizer", so the model keeps the
// flat gradient buffer and the run is sharded as "optimizer" (runtime/comm/sharded_reducer.h).
int64_t ShardedGradScratchFloats(const std::vector<std::pair<int64_t, int64_t>>& groups, int world);

struct MemoryPlan {
  int64_t micro_batch = 0;
  std::string precision;
  std::string shard = "none";  // dist.shard the plan is for (as it runs: see ShardedGradScratch)
  std::vector<LayerMemory> layers;
  int64_t grad_scratch = 0;     // dist.shard = gradients: the groups in flight at once
  int64_t other = 0;            // input batch, loss buffers, shared backend workspace
  int64_t total = 0;            // everything, per rank
  int64_t fixed = 0;            // the part that does not grow with the micro-batch
  int64_t per_sample = 0;       // the part that does, per sample
  int64_t budget = 0;           // memory.limit or the device's capacity; 0 = unknown
  int64_t max_micro_batch = 0;  // largest micro-batch whose total fits the budget; 0 = unknown
  // train.winograd: the total with the direct convolutions training falls back to when this one
  // does not fit; 0 = no convolution planned by Winograd.
  int64_t winograd_direct_total = 0;
  // ... and the largest micro-batch that fits with them (training gives Winograd up first, so
  // this is the largest it can run); 0 = unknown or no Winograd.
  int64_t winograd_direct_max_micro_batch = 0;

  // Sums over the layers.
  int64_t Sum(int64_t LayerMemory::*field) const;
  int64_t params() const { return Sum(&LayerMemory::params); }
  int64_t grads() const { return Sum(&LayerMemory::grads); }
  int64_t optimizer() const { return Sum(&LayerMemory::optimizer); }
  int64_t activations() const { return Sum(&LayerMemory::activations); }

  std::string ToTable() const;
  std::string ToJson() const;
};

// `m` must be Setup() at the micro-batch to plan for (it is not modified). optimizer_slots: state
// tensors per parameter (sgd with momentum 1, adamw 2, plain sgd 0).
MemoryPlan PlanMemory(Model& m, int optimizer_slots, LossKind loss, int64_t budget,
                      const StateSharding& shard = {});

}  // namespace dptrain
