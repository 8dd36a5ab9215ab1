// SPDX-License-Identifier: Apache-2.0
// Optimizers over the model's flat parameter buffer: one fused update per step (SGD with
// momentum / Nesterov / weight decay, AdamW), PyTorch semantics. State lives in flat buffers
// laid out like the parameters, so checkpointing a slot is a view per parameter.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "runtime/optim/shard_layout.h"

namespace dptrain {

// train.optimizer
enum class OptimizerKind : uint8_t { kSgd, kAdamW, kLars };
// train.schedule
enum class ScheduleKind : uint8_t { kConstant, kStep, kCosine, kMultiStep, kOneCycle };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  // [begin, end) ranges of the flat parameter buffer, in floats, ascending and disjoint, that
  // take no weight decay (train.no_weight_decay: biases, batch-norm parameters).
  std::vector<std::pair<int64_t, int64_t>> no_decay;
  // lars: the trust coefficient, and the [begin, end) range of every parameter tensor (each gets
  // its own trust ratio; those inside no_decay are neither decayed nor adapted).
  double lars_eta = 0.001;
  std::vector<std::pair<int64_t, int64_t>> tensors;
};

class Optimizer {
 public:
  // With `shard` (dist.shard), the state covers this rank's chunks only (ShardLayout).
  Optimizer(Backend& be, const OptimizerConfig& cfg, const Tensor& params,
            const ShardLayout* shard = nullptr);

  // params -= update(grads * grad_scale) at learning rate lr. grad_scale turns summed gradients
  // into the mean (1 / (world size * micro-steps)). Increments steps().
  void Step(Tensor* params, const Tensor& grads, float lr, float grad_scale);
  // Sharded: updates this rank's chunks of `params` only. `grads` is the flat gradient buffer
  // or this rank's shard of it; `stepped(g)` runs once group g's chunk is updated (to start
  // sending it while the next group steps).
  void StepShard(Tensor* params, const Tensor& grads, float lr, float grad_scale,
                 const std::function<void(size_t)>& stepped);

  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  // Slot names and flat state buffers: sgd {"momentum_buffer"} (none without momentum),
  // adamw {"exp_avg", "exp_avg_sq"}. Same length and layout as the parameters, or as this
  // rank's shard of them.
  const std::vector<std::string>& slot_names() const { return slot_names_; }
  std::vector<Tensor>& slots() { return slots_; }
  // The layout of slots() when sharded, else null.
  const ShardLayout* shard() const { return shard_ ? &*shard_ : nullptr; }

 private:
  // One fused update of `param` from `grad` with state views `slots` (same length each);
  // `begin` is where `param` starts in the flat buffer (floats): the no-decay ranges inside it
  // are updated with weight decay 0, each run of one kind by one backend call.
  void Update(Tensor* param, const Tensor& grad, std::vector<Tensor>& slots, float lr,
              float grad_scale, int64_t begin);
  void UpdateRun(Tensor* param, const Tensor& grad, std::vector<Tensor>& slots, float lr,
                 float grad_scale, double weight_decay);
  // LARS (You et al. 2017, as torchlars wraps SGD): per tensor, d = trust * (g + wd * w) with
  // trust = eta * |w| / (|g| + wd * |w| + 1e-8) (1 when either norm is 0), then SGD's momentum
  // step. Two norms per tensor (each a SumSquares, which synchronises a device backend).
  void LarsStep(Tensor* params, const Tensor& grads, float lr, float grad_scale);

  Backend& backend_;
  OptimizerConfig cfg_;
  std::optional<ShardLayout> shard_;
  int64_t steps_ = 0;
  std::vector<std::string> slot_names_;
  std::vector<Tensor> slots_;
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kConstant;
  double base_lr = 0.05;
  int64_t warmup_steps = 0;  // linear ramp base_lr * (s + 1) / warmup for s < warmup
  int64_t total_steps = 1;   // cosine: decays to 0 at total_steps
  int64_t step_size = 1;     // step: multiply by gamma every step_size steps after warm-up
  double gamma = 0.1;
  // multistep: multiply by gamma at each of these steps after warm-up (ascending), as
  // torch.optim.lr_scheduler.MultiStepLR.
  std::vector<int64_t> milestones;
  // onecycle (no warm-up of its own: it ramps up itself), as torch's OneCycleLR with its
  // defaults: cosine from base_lr / 25 up to base_lr over the first 30% of total_steps, then
  // down to base_lr / 25 / 1e4 at the last step.
};
// Learning rate of optimizer step s (0-based).
double LearningRate(const ScheduleConfig& c, int64_t s);

// Optimizer state tensors per parameter: adamw 2, sgd with momentum 1, plain sgd 0 (what
// Optimizer::slot_names() will hold; `dptrain plan` counts them before any optimizer exists).
int StateSlots(OptimizerKind kind, double momentum);

}  // namespace dptrain
