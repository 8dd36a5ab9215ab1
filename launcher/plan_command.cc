// SPDX-License-Identifier: Apache-2.0
// `dptrain plan`: builds the model without data and prints its memory plan for one rank.
#include "launcher/plan_command.h"

#include <fmt/format.h>

#include "core/backend_registry.h"
#include "core/error.h"
#include "launcher/process_env.h"
#include "models/memory_plan.h"
#include "models/zoo/zoo.h"

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
  if (cfg.dist.device == DeviceChoice::kAuto) {
    std::string why;
    device = BackendAvailable("cuda", &why) ? "cuda" : "cpu";
  }
  Backend& be = GetBackend(device);
  const bool zoo = !cfg.model.name.empty();
  // The input shape comes from the dataset; without opening it, use the zoo model's input (the
  // data's shape is checked at training time).
  const Shape input = DefaultSampleShape(cfg.model);
  const LossKind loss = ResolveLoss(cfg.model);
  auto net = zoo ? BuildZooModel(be, cfg.model.name, cfg.model.classes)
                 : BuildFromLayers(be, cfg.model.layers);
  Model model(be, std::move(net), input);
  model.Setup(micro, cfg.train.precision);
  const int slots = StateSlots(cfg.train.optimizer, cfg.train.momentum);
  int64_t budget = static_cast<int64_t>(cfg.memory.limit_bytes);
  if (budget == 0) budget = static_cast<int64_t>(be.allocator().Capacity());
  MemoryPlan plan = PlanMemory(model, slots, loss, budget);
  plan.precision = ConfigName(cfg.train.precision);
  if (json) {
    fmt::print("{}\n", plan.ToJson());
  } else {
    fmt::print("{} ranks, global batch {} -> {} per rank{}, input {} ({})\n", world, g, local,
               cfg.train.accumulate > 1
                   ? fmt::format(" = {} x {} micro-steps", micro, cfg.train.accumulate)
                   : "",
               input.ToString(), device);
    fmt::print("{}", plan.ToTable());
    if (budget > 0 && plan.total > budget) {
      fmt::print(
          "does NOT fit: {} MiB needed, {} MiB available; use micro-batch <= {} "
          "(train.accumulate = {}), or train.precision = \"bf16\"\n",
          plan.total >> 20, budget >> 20, plan.max_micro_batch,
          plan.max_micro_batch > 0 ? (local + plan.max_micro_batch - 1) / plan.max_micro_batch : 0);
    }
  }
  return kExitOk;
}

}  // namespace dptrain
