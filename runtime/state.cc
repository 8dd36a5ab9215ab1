// SPDX-License-Identifier: Apache-2.0
// Checkpoints of a run (runtime/trainer_impl.h; format in runtime/checkpoint/checkpoint.h): the
// checkpoint directory, what a run starts from (checkpoint.resume / checkpoint.init, read by
// rank 0), the mapping between the model's flat buffers and the file's named tensors, snapshots
// to host memory and their background writes.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "runtime/trainer_impl.h"

namespace dptrain {

// Rank 0: the checkpoint directory must be writable before any training time is spent.
void Trainer::SetupCheckpointDir() {
  if (!ckpt_io_) return;
  std::error_code ec;
  std::filesystem::create_directories(ckpt_dir_, ec);
  if (ec || !std::filesystem::is_directory(ckpt_dir_, ec)) {
    DPT_THROW(CheckpointError) << "cannot create the checkpoint directory " << ckpt_dir_ << ": "
                               << (ec ? ec.message() : "a file of that name exists")
                               << "; hint: point run_dir at a writable directory";
  }
  const std::string probe = ckpt_dir_ + "/.write-test-" + std::to_string(getpid());
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) {
    const int err = errno;
    DPT_THROW(CheckpointError) << "the checkpoint directory " << ckpt_dir_
                               << " is not writable: " << std::strerror(err)
                               << "; hint: point run_dir at a writable directory";
  }
  ::close(fd);
  ::unlink(probe.c_str());
  for (const std::string& p : RemoveStaleTemporaries(ckpt_dir_)) {
    Say("dptrain: removed " + p + ", the partial file of a checkpoint write that was killed");
  }
  writer_ = std::make_unique<CheckpointWriter>(ckpt_dir_, cfg_.checkpoint.keep,
                                               env_.hooks.checkpoint_pause);
}

// /params: the parameters, the buffers and, per batch-norm layer, the int64 num_batches_tracked
// that torch's state_dict has (dptrain does not use it, so a file may lack it).
std::vector<TensorSpec> Trainer::ParamSpecs() const {
  std::vector<TensorSpec> specs;
  for (const auto& p : model_->named_params()) specs.push_back({p.name, p.tensor.shape().dims()});
  for (const auto& b : model_->named_buffers()) {
    specs.push_back({b.name, b.tensor.shape().dims()});
    const std::string suffix = ".running_mean";
    if (b.name.size() > suffix.size() &&
        b.name.compare(b.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string layer = b.name.substr(0, b.name.size() - suffix.size());
      specs.push_back({layer + ".num_batches_tracked", {}, CheckpointDType::kI64, true});
    }
  }
  return specs;
}

std::vector<TensorSpec> Trainer::OptimizerSpecs() const {
  std::vector<TensorSpec> specs;
  for (const auto& slot : opt_->slot_names()) {
    for (const auto& p : model_->named_params()) {
      specs.push_back({p.name + "/" + slot, p.tensor.shape().dims()});
    }
  }
  return specs;
}

// Copies the checkpoint's tensors named `<name><suffix>` into the flat buffer `flat` (which
// keeps its alignment padding), in one host round trip.
void Trainer::LoadFlat(const std::vector<NamedTensor>& named, Tensor* flat, const Checkpoint& c,
                       const std::string& suffix, bool optimizer_group) {
  std::vector<float> host(static_cast<size_t>(flat->numel()));
  be_.CopyToHost(*flat, host.data());
  for (const auto& n : named) {
    const std::string name = n.name + suffix;
    const CheckpointTensor* t = optimizer_group ? c.FindOptimizer(name) : c.FindParam(name);
    DPT_CHECK(t != nullptr && t->dtype == CheckpointDType::kF32 &&
              static_cast<int64_t>(t->f32.size()) == n.tensor.numel())
        << "checkpoint tensor " << name << " was matched but cannot be loaded";
    std::copy(t->f32.begin(), t->f32.end(), host.begin() + n.offset);
  }
  be_.CopyFromHost(host.data(), flat);
}

void Trainer::LoadTensors(const Checkpoint& c, bool with_optimizer) {
  LoadFlat(model_->named_params(), &model_->params(), c, "", false);
  LoadFlat(model_->named_buffers(), &model_->buffers(), c, "", false);
  if (!with_optimizer) return;
  for (size_t k = 0; k < opt_->slot_names().size(); ++k) {
    const std::string suffix = "/" + opt_->slot_names()[k];
    if (opt_->shard() == nullptr) {
      LoadFlat(model_->named_params(), &opt_->slots()[k], c, suffix, true);
      continue;
    }
    // Sharded: the whole slot on the host; StartFrom sends each rank its chunks.
    std::vector<float> full(static_cast<size_t>(model_->params().numel()), 0.f);
    for (const auto& n : model_->named_params()) {
      const CheckpointTensor* t = c.FindOptimizer(n.name + suffix);
      DPT_CHECK(t != nullptr && static_cast<int64_t>(t->f32.size()) == n.tensor.numel())
          << "checkpoint tensor " << n.name << suffix << " was matched but cannot be loaded";
      std::copy(t->f32.begin(), t->f32.end(), full.begin() + n.offset);
    }
    resume_slots_.push_back(std::move(full));
  }
}

std::vector<float> Trainer::GatherSlot(size_t k) {
  const ShardLayout& l = *opt_->shard();
  std::vector<float> full;
  if (comm_.rank() == 0) full.assign(static_cast<size_t>(model_->params().numel()), 0.f);
  for (size_t g = 0; g < l.groups.size(); ++g) {
    const auto& grp = l.groups[g];
    // One group at a time, into the flat gradient buffer where there is one (its gradients are
    // used up by now; SaveCheckpoint kept their norm for the log line), else into one group of
    // memory (the gradients' scratch, which is free between steps).
    const Shape whole_shape{grp.end - grp.begin};
    Tensor whole = model_->grads().defined()
                       ? model_->grads().View(whole_shape, static_cast<size_t>(grp.begin) * 4)
                       : be_.Empty(whole_shape, DType::kF32, "optimizer state (gather)");
    Tensor mine = whole.View(Shape{grp.chunk},
                             static_cast<size_t>(l.rank) * static_cast<size_t>(grp.chunk) * 4);
    be_.Copy(opt_->slots()[k].View(Shape{grp.chunk}, static_cast<size_t>(grp.shard_offset) * 4),
             &mine);
    comm_.AllGatherAsync(&whole)->Wait();
    if (comm_.rank() == 0) be_.CopyToHost(whole, full.data() + grp.begin);
  }
  return full;
}

void Trainer::ScatterSlots(std::vector<std::vector<float>>* full) {
  const ShardLayout& l = *opt_->shard();
  const auto n = static_cast<size_t>(model_->params().numel());
  for (size_t k = 0; k < opt_->slots().size(); ++k) {
    std::vector<float> host = comm_.rank() == 0 ? std::move((*full)[k]) : std::vector<float>(n);
    DPT_CHECK(host.size() == n) << "optimizer slot " << k << " of " << host.size() << " floats";
    control_.BroadcastHost(host.data(), n * sizeof(float), 0);
    for (size_t g = 0; g < l.groups.size(); ++g) {
      const auto& grp = l.groups[g];
      Tensor dst =
          opt_->slots()[k].View(Shape{grp.chunk}, static_cast<size_t>(grp.shard_offset) * 4);
      be_.CopyFromHost(host.data() + l.OwnBegin(g), &dst);
    }
  }
  full->clear();
}

void Trainer::LoadStartState() {
  const CheckpointConfig& cc = cfg_.checkpoint;
  std::optional<FoundCheckpoint> found;
  if (cc.resume == "auto") {
    std::vector<std::string> skipped;
    found = FindLatestCheckpoint(ckpt_dir_, &skipped);
    for (const std::string& why : skipped) Warn("skipping an invalid checkpoint: " + why);
    if (!found && !skipped.empty()) {
      // Starting over would let checkpoint.keep delete files someone may want to rescue.
      DPT_THROW(CheckpointError) << ckpt_dir_ << " holds " << skipped.size()
                                 << " checkpoint file(s) and none is valid (" << skipped.front()
                                 << "); nothing was changed. To start from scratch anyway, set "
                                 << "checkpoint.resume = \"never\" or use another run_dir";
    }
  } else if (cc.resume != "never") {
    Checkpoint c = ReadCheckpoint(cc.resume);
    if (!c.has_state) {
      DPT_THROW(CheckpointError) << "checkpoint.resume = " << cc.resume
                                 << ": a parameters-only file (no /state) cannot resume a run; "
                                 << "use checkpoint.init to start from its parameters";
    }
    found = FoundCheckpoint{cc.resume, std::move(c)};
  }
  if (found) {
    if (!cc.init.empty()) {
      Say("dptrain: resuming, so checkpoint.init = " + cc.init + " is not used");
    }
    Resume(found->path, found->ckpt);
    return;
  }
  if (cc.resume == "auto") {
    Say("dptrain: no checkpoint in " + ckpt_dir_ + ": starting from scratch");
  }
  if (cc.init.empty()) return;
  const Checkpoint c = ReadCheckpoint(cc.init);
  for (const std::string& n : c.notices) Say("dptrain: notice: " + n);
  MatchCheckpoint(cc.init, c, ParamSpecs(), nullptr);
  LoadTensors(c, false);
  start_.kind = kInit;
  Say(fmt::format("dptrain: parameters initialised from {} (checkpoint.init{})", cc.init,
                  c.has_state ? fmt::format(", saved at step {}", c.state.step) : ""));
}

void Trainer::Resume(const std::string& path, const Checkpoint& c) {
  for (const std::string& n : c.notices) Say("dptrain: notice: " + n);
  const CheckpointState& s = c.state;
  // The sample order is a function of (seed, dataset size, global batch): all must match.
  std::vector<std::string> differ;
  if (s.global_batch != cfg_.train.global_batch) {
    differ.push_back(fmt::format("train.global_batch is {} in the checkpoint, {} in this run",
                                 s.global_batch, cfg_.train.global_batch));
  }
  if (s.seed != cfg_.seed) {
    differ.push_back(
        fmt::format("seed is {} in the checkpoint, {} in this run", s.seed, cfg_.seed));
  }
  if (s.dataset_size != train_->info().size) {
    differ.push_back(fmt::format("the training set has {} samples in the checkpoint, {} now ({})",
                                 s.dataset_size, train_->info().size,
                                 DescribeFiles(cfg_.data.train)));
  }
  if (s.optimizer != ConfigName(cfg_.train.optimizer)) {
    differ.push_back(fmt::format("train.optimizer is {} in the checkpoint, {} in this run",
                                 s.optimizer, ConfigName(cfg_.train.optimizer)));
  }
  if (!differ.empty()) {
    std::string what;
    for (const auto& d : differ) what += (what.empty() ? "" : "; ") + d;
    DPT_THROW(CheckpointError)
        << "checkpoint " << path << " cannot resume this run: " << what
        << ". Resuming continues the same sample order, on any number of ranks, only with the "
        << "same seed, training set and global batch (and optimizer); hint: use another run_dir, "
        << "or checkpoint.init = " << path << " to start a new run from its parameters";
  }
  const std::vector<TensorSpec> opt_specs = OptimizerSpecs();
  MatchCheckpoint(path, c, ParamSpecs(), &opt_specs);
  LoadTensors(c, true);
  DPT_CHECK_AS(CheckpointError, s.samples_in_epoch >= 0 && s.epoch >= 0 && s.step >= 0 &&
                                    s.samples_in_epoch % cfg_.train.global_batch == 0)
      << "checkpoint " << path << ": inconsistent /state (step " << s.step << ", epoch " << s.epoch
      << ", samples_in_epoch " << s.samples_in_epoch << ")";
  start_.kind = kResumed;
  start_.step = s.step;
  start_.epoch = s.epoch;
  start_.in_epoch = s.samples_in_epoch / cfg_.train.global_batch;
  if (start_.in_epoch >= steps_per_epoch_) {  // saved at the very end of an epoch
    ++start_.epoch;
    start_.in_epoch = 0;
  }
  start_.optimizer_steps = s.optimizer_steps;
  start_.last_eval_step = s.last_eval_step;
  start_.elapsed_s = s.elapsed_s;
  start_.lr = s.lr;
  start_.loss_scale = s.loss_scale;
  start_.loss_scale_good_steps = s.loss_scale_good_steps;
  start_.skipped_steps = s.skipped_steps;
  std::string line =
      fmt::format("dptrain: resuming from {}: step {}, epoch {} + {}/{} steps, saved by {} rank{}",
                  path, s.step, start_.epoch, start_.in_epoch, steps_per_epoch_,
                  s.world_size_at_save, s.world_size_at_save == 1 ? "" : "s");
  if (s.world_size_at_save != world_) {
    line += fmt::format(" (now {}: same global batch {}, {} per rank)", world_,
                        cfg_.train.global_batch, local_batch_);
  }
  if (s.step >= total_steps_) {
    line +=
        fmt::format("; it is at or past the last step ({}): nothing left to train", total_steps_);
  }
  Say(line);
}

Checkpoint Trainer::Snapshot(std::vector<std::vector<float>> sharded_slots) {
  Checkpoint c;
  CheckpointState& s = c.state;
  s.step = step_;
  s.epoch = epoch_;
  s.samples_in_epoch = in_epoch_ * cfg_.train.global_batch;
  s.seed = cfg_.seed;
  s.world_size_at_save = world_;
  s.global_batch = cfg_.train.global_batch;
  s.accumulate = accumulate_;
  s.dataset_size = train_->info().size;
  s.steps_per_epoch = steps_per_epoch_;
  s.optimizer_steps = opt_->steps();
  s.optimizer = ConfigName(cfg_.train.optimizer);
  s.schedule = ConfigName(cfg_.train.schedule);
  s.lr = lr_;
  s.last_eval_step = last_eval_step_;
  s.elapsed_s = RunTime();
  if (scaler_->enabled()) {
    s.loss_scale = scaler_->state().scale;
    s.loss_scale_good_steps = scaler_->state().good_steps;
  }
  s.skipped_steps = skipped_steps_;
  s.micro_batch = micro_;
  c.config_toml = env_.resolved_toml;
  c.class_names = train_->info().class_names;
  c.optimizer_kind = ConfigName(cfg_.train.optimizer);
  // One device-to-host copy per flat buffer, then slices on the host.
  auto host = [&](const Tensor& flat) {
    std::vector<float> v(static_cast<size_t>(flat.numel()));
    be_.CopyToHost(flat, v.data());
    return v;
  };
  auto slice = [](const std::vector<float>& flat, const NamedTensor& n, std::string name) {
    CheckpointTensor t;
    t.name = std::move(name);
    t.shape = n.tensor.shape().dims();
    t.f32.assign(flat.begin() + n.offset, flat.begin() + n.offset + n.tensor.numel());
    return t;
  };
  const std::vector<float> params = host(model_->params());
  for (const auto& p : model_->named_params()) c.params.push_back(slice(params, p, p.name));
  const std::vector<float> buffers = host(model_->buffers());
  for (const auto& b : model_->named_buffers()) c.params.push_back(slice(buffers, b, b.name));
  for (const TensorSpec& spec : ParamSpecs()) {
    if (spec.dtype != CheckpointDType::kI64) continue;
    // torch counts training-mode forward calls: one per micro-step.
    CheckpointTensor t;
    t.name = spec.name;
    t.dtype = CheckpointDType::kI64;
    t.i64 = {step_ * accumulate_};
    c.params.push_back(std::move(t));
  }
  for (size_t k = 0; k < opt_->slot_names().size(); ++k) {
    const std::vector<float> slot =
        k < sharded_slots.size() ? std::move(sharded_slots[k]) : host(opt_->slots()[k]);
    for (const auto& p : model_->named_params()) {
      c.optimizer.push_back(slice(slot, p, p.name + "/" + opt_->slot_names()[k]));
    }
  }
  return c;
}

// Every rank calls it at the same step; only rank 0 copies the state (synchronously: the next
// step changes it) and hands it to the background writer.
void Trainer::SaveCheckpoint() {
  if (step_ == last_ckpt_step_) return;
  last_ckpt_step_ = step_;
  std::vector<std::vector<float>> slots;  // dist.shard: gathered by every rank, on rank 0
  const auto t0 = Clock::now();
  if (opt_->shard() != nullptr) {
    int64_t writes = ckpt_io_ && writer_ != nullptr ? 1 : 0;
    control_.BroadcastHost(&writes, sizeof writes, 0);
    if (writes == 0) return;
    if (win_steps_ > 0 && !grad_sq_saved_) grad_sq_saved_ = GradSquaredNorm();  // collective
    for (size_t k = 0; k < opt_->slots().size(); ++k) slots.push_back(GatherSlot(k));
  }
  if (!ckpt_io_ || writer_ == nullptr) return;
  Checkpoint c = Snapshot(std::move(slots));
  copy_s_[step_] = Since(t0);
  writer_->Submit(std::move(c));
}

void Trainer::ReportWrites() {
  if (writer_ == nullptr) return;
  for (const CheckpointWriteStats& w : writer_->TakeCompleted()) {
    result_.last_checkpoint = w.path;
    const double copy_s = copy_s_[w.step];
    copy_s_.erase(w.step);
    for (const std::string& n : w.notices) Warn(n);
    Say(
        fmt::format("checkpoint {} ({:.1f} MB; host copy {:.1f} ms, written in {:.2f} s in the "
                    "background{})",
                    w.path, static_cast<double>(w.bytes) / 1e6, 1e3 * copy_s, w.seconds,
                    w.deleted.empty() ? "" : fmt::format("; {} older removed", w.deleted.size())));
    if (is_root()) {
      // epoch: the epochs complete at the checkpoint's step (as in the summary).
      WriteMetrics({{"kind", "checkpoint"},
                    {"step", w.step},
                    {"epoch", w.step / std::max<int64_t>(steps_per_epoch_, 1)},
                    {"time_s", RunTime()},
                    {"path", w.path},
                    {"bytes", w.bytes},
                    {"copy_ms", 1e3 * copy_s},
                    {"write_s", w.seconds}});
    }
  }
}

}  // namespace dptrain
