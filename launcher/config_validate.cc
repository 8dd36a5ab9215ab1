// SPDX-License-Identifier: Apache-2.0
// Config validation: value ranges and the rules between keys, checked once the file and every
// --set are applied; each error names the key and where its value came from.
#include <optional>
#include <string>

#include "core/error.h"
#include "core/memory/caching_allocator.h"
#include "core/util/strings.h"
#include "launcher/config_schema.h"

namespace dptrain::config_detail {
namespace {

// Range checks: fail naming the key and its origin.
void AtLeast(const Origins& origins, std::string_view key, int64_t v, int64_t min) {
  if (v < min) {
    Fail(origins.Where(key),
         std::string(key) + " must be >= " + std::to_string(min) + ", got " + std::to_string(v));
  }
}

// An integer that is used as a count of threads, megabytes and the like: a bound far beyond any
// real setting keeps it from wrapping around where it is narrowed or multiplied.
void InRange(const Origins& origins, std::string_view key, int64_t v, int64_t min, int64_t max) {
  AtLeast(origins, key, v, min);
  if (v > max) {
    Fail(origins.Where(key),
         std::string(key) + " must be <= " + std::to_string(max) + ", got " + std::to_string(v));
  }
}

void Positive(const Origins& origins, std::string_view key, double v) {
  if (!(v > 0)) Fail(origins.Where(key), std::string(key) + " must be > 0, got " + FormatFloat(v));
}

void NonNegative(const Origins& origins, std::string_view key, double v) {
  if (!(v >= 0)) {
    Fail(origins.Where(key), std::string(key) + " must be >= 0, got " + FormatFloat(v));
  }
}

void UnitInterval(const Origins& origins, std::string_view key, double v) {  // [0, 1)
  if (!(v >= 0 && v < 1)) {
    Fail(origins.Where(key), std::string(key) + " must be in [0, 1), got " + FormatFloat(v));
  }
}

}  // namespace

void Validate(TrainConfig& c, const Origins& origins) {
  if (c.run_dir.empty()) Fail(origins.Where("run_dir"), "run_dir must not be empty");
  AtLeast(origins, "seed", c.seed, 0);

  // [model]
  const bool has_name = !c.model.name.empty();
  const bool has_layers = !c.model.layers.empty();
  const bool has_onnx = !c.model.onnx.empty();
  if (has_name + has_layers + has_onnx > 1) {
    std::string set;
    for (const auto& [on, key] : {std::pair{has_name, "model.name"},
                                  {has_layers, "model.layers"},
                                  {has_onnx, "model.onnx"}}) {
      if (on) set += std::string(set.empty() ? "" : " and ") + key;
    }
    Fail(origins.WhereAny({"model.name", "model.layers", "model.onnx"}),
         set + " are both set; give one: a zoo model name, a list of layers or an ONNX file");
  }
  if (!has_name && !has_layers && !has_onnx) {
    Fail(origins.WhereAny({"model.name", "model.layers", "model.onnx"}),
         "no model: set model.name (a zoo model, e.g. \"ref_cnn\"), model.layers (a list of "
         "layers) or model.onnx (a file from torch.onnx.export)");
  }
  AtLeast(origins, "model.classes", c.model.classes, 1);

  // [data]
  if (c.data.train.empty()) {
    Fail(origins.Where("data.train"),
         "data.train is required: an HDF5 file (see `dptrain convert`) or \"synthetic\"");
  }
  if (c.data.mean.size() != c.data.std.size()) {
    Fail(origins.WhereAny({"data.std", "data.mean"}),
         "data.mean has " + std::to_string(c.data.mean.size()) + " entries but data.std has " +
             std::to_string(c.data.std.size()) + "; give one per channel for both, or neither");
  }
  for (size_t i = 0; i < c.data.std.size(); ++i) {
    if (!(c.data.std[i] > 0)) {
      Fail(origins.Where("data.std"),
           "data.std[" + std::to_string(i) + "] must be > 0, got " + FormatFloat(c.data.std[i]));
    }
  }
  InRange(origins, "data.workers", c.data.workers, 0, 256);
  AtLeast(origins, "data.crop", c.data.crop, 0);
  AtLeast(origins, "data.synthetic_samples", c.data.synthetic_samples, 1);

  // [train]
  const TrainLoopConfig& t = c.train;
  AtLeast(origins, "train.epochs", t.epochs, 0);
  AtLeast(origins, "train.max_steps", t.max_steps, 0);
  if (t.epochs == 0 && t.max_steps == 0) {
    Fail(origins.WhereAny({"train.epochs", "train.max_steps"}),
         "train.epochs and train.max_steps are both 0, so there is nothing to train; set one of "
         "them > 0");
  }
  AtLeast(origins, "train.global_batch", t.global_batch, 1);
  AtLeast(origins, "train.accumulate", t.accumulate, 1);
  if (t.global_batch % t.accumulate != 0) {
    Fail(origins.WhereAny({"train.accumulate", "train.global_batch"}),
         "train.global_batch (" + std::to_string(t.global_batch) +
             ") must be divisible by train.accumulate (" + std::to_string(t.accumulate) +
             "); each optimizer step runs accumulate micro-batches of global_batch / accumulate");
  }
  Positive(origins, "train.lr", t.lr);
  UnitInterval(origins, "train.momentum", t.momentum);
  Positive(origins, "train.lars_eta", t.lars_eta);
  if (t.optimizer == OptimizerKind::kLars && c.dist.shard != ShardMode::kNone) {
    Fail(origins.WhereAny({"dist.shard", "train.optimizer"}),
         "train.optimizer = \"lars\" needs every tensor whole on each rank for its per-layer "
         "trust ratio; use dist.shard = \"none\"");
  }
  if (t.nesterov && t.optimizer != OptimizerKind::kAdamW && t.momentum == 0) {
    Fail(origins.WhereAny({"train.nesterov", "train.momentum"}),
         "train.nesterov = true needs train.momentum > 0");
  }
  NonNegative(origins, "train.weight_decay", t.weight_decay);
  for (const std::string& group : t.no_weight_decay) {
    if (group != "bias" && group != "bn") {
      Fail(origins.Where("train.no_weight_decay"),
           "train.no_weight_decay: unknown group " + Quote(group) +
               "; the groups are \"bias\" (every bias) and \"bn\" (batch-norm weights and "
               "biases)");
    }
  }
  UnitInterval(origins, "train.beta1", t.beta1);
  UnitInterval(origins, "train.beta2", t.beta2);
  Positive(origins, "train.eps", t.eps);
  AtLeast(origins, "train.step_size", t.step_size, 0);
  Positive(origins, "train.gamma", t.gamma);
  AtLeast(origins, "train.warmup_steps", t.warmup_steps, 0);
  if (t.schedule == ScheduleKind::kMultiStep && t.milestones.empty()) {
    Fail(origins.WhereAny({"train.milestones", "train.schedule"}),
         "train.schedule = \"multistep\" needs train.milestones, the epochs at which lr is "
         "multiplied by train.gamma (e.g. [30, 60, 80])");
  }
  if (t.schedule != ScheduleKind::kMultiStep && !t.milestones.empty()) {
    Fail(origins.Where("train.milestones"),
         "train.milestones applies to train.schedule = \"multistep\" only");
  }
  for (size_t i = 0; i < t.milestones.size(); ++i) {
    if (!(t.milestones[i] > (i > 0 ? t.milestones[i - 1] : 0.0))) {
      Fail(origins.Where("train.milestones"),
           "train.milestones must be ascending epochs > 0, got " + FormatFloatList(t.milestones));
    }
  }
  if (t.schedule == ScheduleKind::kOneCycle && t.warmup_steps > 0) {
    Fail(origins.WhereAny({"train.warmup_steps", "train.schedule"}),
         "train.warmup_steps does not apply to train.schedule = \"onecycle\", which ramps up "
         "over its first 30% of steps itself; set warmup_steps = 0");
  }
  UnitInterval(origins, "train.label_smoothing", t.label_smoothing);
  if (t.label_smoothing > 0 && c.model.loss == LossChoice::kMse) {
    Fail(origins.WhereAny({"train.label_smoothing", "model.loss"}),
         "train.label_smoothing applies to the cross-entropy loss, not model.loss = \"mse\"");
  }
  NonNegative(origins, "train.clip_grad_norm", t.clip_grad_norm);
  AtLeast(origins, "train.log_every_steps", t.log_every_steps, 1);
  AtLeast(origins, "train.eval_every_epochs", t.eval_every_epochs, 0);

  // [checkpoint]
  AtLeast(origins, "checkpoint.every_steps", c.checkpoint.every_steps, 0);
  AtLeast(origins, "checkpoint.every_epochs", c.checkpoint.every_epochs, 0);
  AtLeast(origins, "checkpoint.keep", c.checkpoint.keep, 1);
  if (c.checkpoint.resume.empty()) {
    Fail(origins.Where("checkpoint.resume"),
         "checkpoint.resume must be \"auto\", \"never\" or a checkpoint path, got \"\"");
  }

  // [memory]
  c.memory.limit_bytes = 0;
  if (!c.memory.limit.empty()) {
    std::string why;
    const std::optional<size_t> bytes = TryParseByteSize(c.memory.limit, &why);
    if (!bytes) {
      // "0.5" is a positive number but no whole byte (0 bytes would mean no limit).
      Fail(origins.Where("memory.limit"),
           "memory.limit: " + Quote(c.memory.limit) + " " + why +
               " (examples: \"512MiB\", \"2GiB\", \"1048576\"; \"\" = no limit)");
    }
    c.memory.limit_bytes = bytes.value_or(0);
  }

  // [dist]
  const DistConfig& d = c.dist;
  if (d.backend == CommBackend::kNccl && d.device == DeviceChoice::kCpu) {
    Fail(origins.WhereAny({"dist.backend", "dist.device"}),
         "dist.backend = \"nccl\" needs GPUs, but dist.device = \"cpu\"; use backend \"mpi\" or "
         "\"auto\"");
  }
  // dist.gpus: "2,3", UUIDs or MIG ids; the binder resolves them, here only the list's shape.
  for (size_t start = 0; !d.gpus.empty();) {
    const size_t comma = d.gpus.find(',', start);
    if (Trim(std::string_view(d.gpus).substr(start, comma - start)).empty()) {
      Fail(origins.Where("dist.gpus"), "dist.gpus: empty entry in " + Quote(d.gpus) +
                                           "; expected a comma-separated list like \"2,3\"");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  InRange(origins, "dist.bucket_mb", d.bucket_mb, 1, 1 << 20);
  Positive(origins, "dist.collective_timeout_s", d.collective_timeout_s);
  InRange(origins, "dist.threads", d.threads, 0, 1024);
  AtLeast(origins, "dist.check_replicas_every", d.check_replicas_every, 0);
}

}  // namespace dptrain::config_detail
