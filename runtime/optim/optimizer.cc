// SPDX-License-Identifier: Apache-2.0
// Optimizer state allocation, the fused update and the learning-rate schedules.
#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dptrain {

Optimizer::Optimizer(Backend& be, const OptimizerConfig& cfg, const Tensor& params,
                     const ShardLayout* shard)
    : backend_(be), cfg_(cfg) {
  if (shard != nullptr) shard_ = *shard;
  const Shape state_shape = shard_ ? Shape{shard_->shard_floats} : params.shape();
  switch (cfg_.kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kLars:
      if (cfg_.momentum != 0) slot_names_ = {"momentum_buffer"};
      break;
    case OptimizerKind::kAdamW:
      slot_names_ = {"exp_avg", "exp_avg_sq"};
      break;
  }
  for (const auto& n : slot_names_) {
    slots_.push_back(be.Zeros(state_shape, DType::kF32,
                              "optimizer " + n + (shard_ ? " (this rank's shard)" : "")));
  }
}

void Optimizer::Step(Tensor* params, const Tensor& grads, float lr, float grad_scale) {
  DPT_CHECK(!shard_) << "Optimizer::Step on a sharded optimizer";
  ++steps_;
  if (cfg_.kind == OptimizerKind::kLars) {
    LarsStep(params, grads, lr, grad_scale);
    return;
  }
  Update(params, grads, slots_, lr, grad_scale, 0);
}

void Optimizer::LarsStep(Tensor* params, const Tensor& grads, float lr, float grad_scale) {
  std::vector<Tensor> slot_views(slots_.size());
  for (const auto& range : cfg_.tensors) {
    // Plain names, not a structured binding: clang 14 cannot capture those in the lambda.
    const int64_t begin = range.first, end = range.second;
    const Shape s{end - begin};
    const auto bytes = static_cast<size_t>(begin) * 4;
    Tensor p = params->View(s, bytes);
    const Tensor g = grads.View(s, bytes);
    for (size_t k = 0; k < slots_.size(); ++k) slot_views[k] = slots_[k].View(s, bytes);
    const bool excluded =
        std::any_of(cfg_.no_decay.begin(), cfg_.no_decay.end(),
                    [&](const auto& r) { return r.first <= begin && end <= r.second; });
    if (excluded) {  // no decay, no adaptation: plain SGD
      UpdateRun(&p, g, slot_views, lr, grad_scale, 0.0);
      continue;
    }
    const double wn = std::sqrt(backend_.SumSquares(p));
    const double gn = std::sqrt(backend_.SumSquares(g)) * grad_scale;
    const double trust =
        wn > 0 && gn > 0 ? cfg_.lars_eta * wn / (gn + cfg_.weight_decay * wn + 1e-8) : 1.0;
    UpdateRun(&p, g, slot_views, lr, static_cast<float>(grad_scale * trust),
              cfg_.weight_decay * trust);
  }
}

void Optimizer::StepShard(Tensor* params, const Tensor& grads, float lr, float grad_scale,
                          const std::function<void(size_t)>& stepped) {
  DPT_CHECK(shard_) << "Optimizer::StepShard without a shard layout";
  DPT_CHECK(cfg_.kind != OptimizerKind::kLars) << "lars is not sharded (config validation)";
  const bool flat = grads.numel() == params->numel();
  DPT_CHECK(flat || grads.numel() == shard_->shard_floats)
      << "sharded step: " << grads.numel() << " gradients for " << params->numel()
      << " parameters, shard " << shard_->shard_floats;
  ++steps_;
  std::vector<Tensor> slot_views(slots_.size());
  for (size_t g = 0; g < shard_->groups.size(); ++g) {
    const auto& grp = shard_->groups[g];
    const Shape s{grp.chunk};
    const auto own = static_cast<size_t>(shard_->OwnBegin(g)) * 4;
    const auto in_shard = static_cast<size_t>(grp.shard_offset) * 4;
    Tensor p = params->View(s, own);
    const Tensor gr = grads.View(s, flat ? own : in_shard);
    for (size_t k = 0; k < slots_.size(); ++k) slot_views[k] = slots_[k].View(s, in_shard);
    Update(&p, gr, slot_views, lr, grad_scale, shard_->OwnBegin(g));
    if (stepped) stepped(g);
  }
}

void Optimizer::Update(Tensor* params, const Tensor& grads, std::vector<Tensor>& slots, float lr,
                       float grad_scale, int64_t begin) {
  const int64_t n = params->numel();
  if (cfg_.no_decay.empty() || cfg_.weight_decay == 0) {
    UpdateRun(params, grads, slots, lr, grad_scale, cfg_.weight_decay);
    return;
  }
  // Cut [begin, begin + n) where no-decay ranges start and end; update each run alike.
  std::vector<Tensor> slot_views(slots.size());
  auto range = std::upper_bound(cfg_.no_decay.begin(), cfg_.no_decay.end(), begin,
                                [](int64_t v, const auto& r) { return v < r.second; });
  for (int64_t at = 0; at < n;) {
    const int64_t pos = begin + at;
    const bool inside = range != cfg_.no_decay.end() && range->first <= pos;
    const int64_t limit =
        range == cfg_.no_decay.end() ? begin + n : (inside ? range->second : range->first);
    const int64_t len = std::min(limit, begin + n) - pos;
    const Shape s{len};
    const auto bytes = static_cast<size_t>(at) * 4;
    Tensor p = params->View(s, bytes);
    const Tensor g = grads.View(s, bytes);
    for (size_t k = 0; k < slots.size(); ++k) slot_views[k] = slots[k].View(s, bytes);
    UpdateRun(&p, g, slot_views, lr, grad_scale, inside ? 0.0 : cfg_.weight_decay);
    if (inside && pos + len == range->second) ++range;
    at += len;
  }
}

void Optimizer::UpdateRun(Tensor* params, const Tensor& grads, std::vector<Tensor>& slots, float lr,
                          float grad_scale, double weight_decay) {
  if (cfg_.kind != OptimizerKind::kAdamW) {  // sgd, and lars's step once scaled
    const ew::SgdHyper h{lr, static_cast<float>(cfg_.momentum), static_cast<float>(weight_decay),
                         grad_scale, cfg_.nesterov};
    backend_.SgdStep(h, params, grads, slots.empty() ? nullptr : &slots[0]);
  } else {
    const double t = static_cast<double>(steps_);
    const ew::AdamWHyper h{lr,
                           static_cast<float>(cfg_.beta1),
                           static_cast<float>(cfg_.beta2),
                           static_cast<float>(cfg_.eps),
                           static_cast<float>(weight_decay),
                           grad_scale,
                           static_cast<float>(1 - std::pow(cfg_.beta1, t)),
                           static_cast<float>(1 - std::pow(cfg_.beta2, t))};
    backend_.AdamWStep(h, params, grads, &slots[0], &slots[1]);
  }
}

double LearningRate(const ScheduleConfig& c, int64_t s) {
  if (c.warmup_steps > 0 && s < c.warmup_steps) {
    return c.base_lr * static_cast<double>(s + 1) / static_cast<double>(c.warmup_steps);
  }
  const int64_t t = s - c.warmup_steps;
  switch (c.kind) {
    case ScheduleKind::kConstant:
      break;
    case ScheduleKind::kStep: {
      const int64_t decays = t / std::max<int64_t>(c.step_size, 1);  // whole periods completed
      return c.base_lr * std::pow(c.gamma, static_cast<double>(decays));
    }
    case ScheduleKind::kCosine: {
      const int64_t span = std::max<int64_t>(c.total_steps - c.warmup_steps, 1);
      const double frac = std::min(1.0, static_cast<double>(t) / static_cast<double>(span));
      return c.base_lr * 0.5 * (1 + std::cos(M_PI * frac));
    }
    case ScheduleKind::kMultiStep: {
      const auto passed = std::count_if(c.milestones.begin(), c.milestones.end(),
                                        [t](int64_t m) { return m <= t; });
      return c.base_lr * std::pow(c.gamma, static_cast<double>(passed));
    }
    case ScheduleKind::kOneCycle: {
      // torch.optim.lr_scheduler.OneCycleLR (pct_start 0.3, div_factor 25, final_div_factor
      // 1e4, cosine annealing, two phases), step by step as torch computes it.
      const double initial = c.base_lr / 25, final_lr = initial / 1e4;
      const double up_end = 0.3 * static_cast<double>(c.total_steps) - 1;
      const double down_end = static_cast<double>(c.total_steps) - 1;
      const auto anneal = [](double from, double to, double pct) {
        return to + (from - to) / 2 * (std::cos(M_PI * pct) + 1);
      };
      const auto x = static_cast<double>(s);
      if (x <= up_end) return anneal(initial, c.base_lr, x / up_end);
      return anneal(c.base_lr, final_lr, (x - up_end) / (down_end - up_end));
    }
  }
  return c.base_lr;
}

int StateSlots(OptimizerKind kind, double momentum) {
  if (kind == OptimizerKind::kAdamW) return 2;
  return momentum != 0 ? 1 : 0;
}

}  // namespace dptrain
