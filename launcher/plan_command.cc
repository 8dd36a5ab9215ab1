// SPDX-License-Identifier: Apache-2.0
// `dptrain plan`: builds the model without data and prints its memory plan for one rank.
#include "launcher/plan_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "core/backend_registry.h"
#include "core/error.h"
#include "launcher/process_env.h"
#include "models/memory_plan.h"
#include "models/zoo/zoo.h"
#include "runtime/comm/sharded_reducer.h"

namespace dptrain {

int RunPlanCommand(const TrainConfig& cfg, int ranks, bool json) {
  const int world = ranks > 0 ? ranks : LauncherWorldSize(SystemGetEnv());
  const int64_t g = cfg.train.global_batch;
  DPT_CHECK_AS(ConfigError, g % world == 0)
      << "train.global_batch = " << g << " is not divisible by the " << world << " ranks";
  const int64_t local = g / world;
  DPT_CHECK_AS(ConfigError, local % cfg.train.accumulate == 0)
      << "train.accumulate = " << cfg.train.accumulate << " does not divide the per-rank batch "
      << local;
  const int64_t micro = local / cfg.train.accumulate;

  std::string device = ConfigName(cfg.dist.device);
  std::string why;
  if (cfg.dist.device == DeviceChoice::kAuto) {
    device = BackendAvailable("cuda", &why) ? "cuda" : "cpu";
  }
  // A plan for GPUs made where there is none (a login node sizing a job): the CPU backend builds
  // the model, without what only it runs between layers (its bf16 handoffs and fused conv +
  // pool: Backend::SetCpuFusions), so that the tensors are those of the CUDA backend; the
  // device's capacity and cuDNN's workspaces are unknown here.
  const bool gpu_elsewhere = device == "cuda" && !BackendAvailable("cuda", &why);
  Backend& be = GetBackend(gpu_elsewhere ? "cpu" : device);
  const ScopedCpuFusions fusions(be, !gpu_elsewhere);
  // The input shape comes from the dataset; without opening it, use the zoo model's input (the
  // data's shape is checked at training time), or data.crop's crop of it.
  Shape input = DefaultSampleShape(cfg.model);
  if (cfg.data.crop > 0 && input.rank() == 3) input = Shape{input[0], cfg.data.crop, cfg.data.crop};
  // train.winograd as training applies it: its buffers counted where it acts (a CPU with
  // Winograd kernels, fp32), and the direct plan beside it, which training falls back to when
  // they do not fit.
  const bool winograd =
      cfg.train.winograd && !gpu_elsewhere && be.WinogradProblem(cfg.train.precision).empty();
  be.SetWinograd(winograd);
  const LossKind loss = ResolveLoss(cfg.model);
  const int slots = StateSlots(cfg.train.optimizer, cfg.train.momentum);
  int64_t budget = static_cast<int64_t>(cfg.memory.limit_bytes);
  if (budget == 0 && !gpu_elsewhere) budget = static_cast<int64_t>(be.allocator().Capacity());
  // The plan for each dist.shard, the configured one in full. Groups as training cuts them.
  const auto plan_for = [&](ShardMode mode, bool recompute) {
    MemoryConfig mem = cfg.memory;
    mem.recompute = recompute;
    Model model(be, BuildNet(be, cfg.model, mem, input), input);
    model.Setup(micro, cfg.train.precision,
                ShardedFlatLayout(mode, world, static_cast<size_t>(cfg.dist.bucket_mb) << 20));
    MemoryPlan p = PlanMemory(model, slots, loss, budget, PlanSharding(mode, world));
    p.precision = ConfigName(cfg.train.precision);
    return p;
  };
  MemoryPlan plan = plan_for(cfg.dist.shard, cfg.memory.recompute);
  std::optional<MemoryPlan> direct;
  if (winograd) {
    be.SetWinograd(false);
    direct = plan_for(cfg.dist.shard, cfg.memory.recompute);
    be.SetWinograd(true);
    plan.winograd_direct_total = direct->total;
    plan.winograd_direct_max_micro_batch = direct->max_micro_batch;
  }
  // What training fits when this plan does not: it gives train.winograd up first.
  const bool gives_way = direct && budget > 0 && plan.total > budget;
  const MemoryPlan& fitted = gives_way ? *direct : plan;
  const bool fits = budget <= 0 || fitted.total <= budget;
  // When it does not: train.accumulate must divide the per-rank batch, so the advice is the
  // largest micro-batch that fits and divides it (1 always does); 0 = not even one sample fits.
  int64_t advice_micro = 0;
  if (!fits && fitted.max_micro_batch > 0) {
    advice_micro = std::min(fitted.max_micro_batch, local);
    while (local % advice_micro != 0) --advice_micro;
  }
  // With memory.recompute off, what turning it on would take (as configured otherwise).
  std::optional<MemoryPlan> recomputed;
  if (!cfg.memory.recompute) recomputed = plan_for(cfg.dist.shard, true);
  const bool recompute_fits = recomputed && budget > 0 && recomputed->total <= budget;
  // Per rank by dist.shard (only with more than one rank: nothing to shard on one).
  std::vector<std::pair<ShardMode, MemoryPlan>> shards;
  if (world > 1) {
    for (ShardMode mode : {ShardMode::kNone, ShardMode::kOptimizer, ShardMode::kGradients}) {
      shards.emplace_back(mode,
                          mode == cfg.dist.shard ? plan : plan_for(mode, cfg.memory.recompute));
    }
  }
  if (json) {
    // The table's object, and what the text says around it.
    nlohmann::json j = nlohmann::json::parse(plan.ToJson());
    j["ranks"] = world;
    j["global_batch"] = g;
    j["per_rank_batch"] = local;
    j["accumulate"] = cfg.train.accumulate;
    j["input_shape"] = input.dims();
    j["device"] = gpu_elsewhere ? "cuda (planned with the CPU backend)" : device;
    j["winograd_gives_way"] = gives_way;
    j["fits"] = fits;
    if (!fits) {
      j["advice"] = {{"micro_batch", advice_micro},
                     {"accumulate", advice_micro > 0 ? local / advice_micro : 0}};
    }
    if (recomputed) {
      j["recompute_total_bytes"] = recomputed->total;
      j["recompute_max_micro_batch"] = recomputed->max_micro_batch;
    }
    if (!shards.empty()) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& [mode, p] : shards) {
        rows.push_back({{"shard", ConfigName(mode)},
                        {"params_bytes", p.params()},
                        {"grads_bytes", p.grads() + p.grad_scratch},
                        {"optimizer_bytes", p.optimizer()},
                        {"activations_bytes", p.activations()},
                        {"total_bytes", p.total}});
      }
      j["per_shard"] = std::move(rows);
    }
    fmt::print("{}\n", j.dump());
    return kExitOk;
  }
  fmt::print("{} ranks, global batch {} -> {} per rank{}, input {} ({})\n", world, g, local,
             cfg.train.accumulate > 1
                 ? fmt::format(" = {} x {} micro-steps", micro, cfg.train.accumulate)
                 : "",
             input.ToString(),
             gpu_elsewhere ? "per GPU; no GPU here (" + why +
                                 "): planned with the CPU backend's shapes, GPU capacity and "
                                 "cuDNN workspaces not counted, set memory.limit to check a "
                                 "budget"
                           : device);
  fmt::print("{}", plan.ToTable());
  if (!shards.empty()) {
    const auto mb = [](int64_t v) { return static_cast<double>(v) / (1 << 20); };
    fmt::print("per rank by dist.shard, MiB:\n{:<11} {:>9} {:>9} {:>9} {:>11} {:>9}\n", "shard",
               "params", "grads", "optim", "activations", "total");
    for (const auto& [mode, p] : shards) {
      fmt::print("{:<11} {:>9.2f} {:>9.2f} {:>9.2f} {:>11.2f} {:>9.2f}{}\n", ConfigName(mode),
                 mb(p.params()), mb(p.grads() + p.grad_scratch), mb(p.optimizer()),
                 mb(p.activations()), mb(p.total),
                 mode == cfg.dist.shard ? "  <- this config" : "");
    }
    for (const auto& [mode, p] : shards) {
      if (mode == ShardMode::kGradients && p.shard != "gradients") {
        fmt::print("{}\n", kGradientsRunAsOptimizer);
      }
    }
  }
  if (direct) {
    fmt::print(
        "train.winograd: its buffers take {} MiB of the total (direct convolutions: {} MiB){}\n",
        (plan.total - direct->total) >> 20, direct->total >> 20,
        gives_way ? "; they do not fit, so training gives them up and runs direct" : "");
  }
  if (recomputed) {
    fmt::print("memory.recompute = true would need {} MiB{}, for about one more forward a step\n",
               recomputed->total >> 20,
               budget > 0 ? fmt::format(" (the largest micro-batch that fits: {})",
                                        recomputed->max_micro_batch)
                          : "");
  }
  const std::string or_recompute =
      recompute_fits
          ? fmt::format(", or memory.recompute = true ({} MiB: fits)", recomputed->total >> 20)
          : "";
  if (!fits && advice_micro == 0) {
    fmt::print(
        "does NOT fit: {} MiB needed, {} MiB available, and not even one sample fits: the "
        "parameters, gradients and optimizer state alone need {} MiB; use dist.shard, "
        "train.precision = \"bf16\", a smaller model, or a larger memory.limit{}\n",
        fitted.total >> 20, budget >> 20, fitted.fixed >> 20, or_recompute);
  } else if (!fits) {
    fmt::print(
        "does NOT fit: {} MiB needed, {} MiB available; micro-batch {} fits (up to {}): set "
        "train.accumulate = {} (the global batch and the maths stay the same), or "
        "train.precision = \"bf16\"{}\n",
        fitted.total >> 20, budget >> 20, advice_micro, fitted.max_micro_batch,
        local / advice_micro, or_recompute);
  }
  return kExitOk;
}

}  // namespace dptrain
