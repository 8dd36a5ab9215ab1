// SPDX-License-Identifier: Apache-2.0
// TrainConfig: the run configuration as typed structs, one per TOML table (DESIGN.md section 7).
// Every choice among named values is an enum, parsed once by the launcher (launcher/config.h)
// and never compared as a string below it; ConfigName() gives the spelling the file uses. Also
// the two facts every user of a config derives the same way: the loss and the input shape.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "models/graph.h"
#include "models/loss.h"
#include "models/model_spec.h"
#include "runtime/optim/optimizer.h"

namespace dptrain {

// model.loss: "auto" takes the zoo model's own loss (mse for `linear`), else cross-entropy.
enum class LossChoice : uint8_t { kAuto, kCrossEntropy, kMse };
// dist.device
enum class DeviceChoice : uint8_t { kAuto, kCpu, kCuda };
// dist.backend: the gradient communicator (nccl needs the cuda device; auto picks it there).
enum class CommBackend : uint8_t { kAuto, kMpi, kNccl };
// dist.device_binding (DESIGN.md section 4): remap narrows CUDA_VISIBLE_DEVICES to the rank's
// GPU; set-device keeps every GPU visible and calls cudaSetDevice(local rank).
enum class BindingPolicy : uint8_t { kRemap, kSetDevice };

// The config file's spelling of each value, in the enum's order.
template <class E>
struct ConfigNames;
template <>
struct ConfigNames<LossChoice> {
  static constexpr std::array<std::string_view, 3> kNames{"auto", "cross_entropy", "mse"};
};
template <>
struct ConfigNames<Augment> {
  static constexpr std::array<std::string_view, 3> kNames{"none", "crop-flip",
                                                          "random-resized-crop"};
};
template <>
struct ConfigNames<CacheMode> {
  static constexpr std::array<std::string_view, 3> kNames{"auto", "ram", "chunks"};
};
template <>
struct ConfigNames<OptimizerKind> {
  static constexpr std::array<std::string_view, 3> kNames{"sgd", "adamw", "lars"};
};
template <>
struct ConfigNames<ScheduleKind> {
  static constexpr std::array<std::string_view, 5> kNames{"constant", "step", "cosine", "multistep",
                                                          "onecycle"};
};
template <>
struct ConfigNames<Precision> {
  static constexpr std::array<std::string_view, 3> kNames{"fp32", "bf16", "fp16"};
};
template <>
struct ConfigNames<DeviceChoice> {
  static constexpr std::array<std::string_view, 3> kNames{"auto", "cpu", "cuda"};
};
template <>
struct ConfigNames<CommBackend> {
  static constexpr std::array<std::string_view, 3> kNames{"auto", "mpi", "nccl"};
};
template <>
struct ConfigNames<BindingPolicy> {
  static constexpr std::array<std::string_view, 2> kNames{"remap", "set-device"};
};
template <>
struct ConfigNames<ShardMode> {
  static constexpr std::array<std::string_view, 3> kNames{"none", "optimizer", "gradients"};
};

// "sgd" for OptimizerKind::kSgd: the value as the config file (and the checkpoint) spells it.
template <class E>
std::string ConfigName(E e) {
  return std::string(ConfigNames<E>::kNames[static_cast<size_t>(e)]);
}

// One entry of `model.layers`, e.g. {type = "conv2d", out = 32, kernel = 3, pad = 1}.
// Which keys a layer takes depends on its type; a key that does not apply to the type is an error:
//   conv2d:  out (required), kernel (required), stride = 1, pad = 0, bias = true
//   linear:  out (required), bias = true
//   maxpool, avgpool: kernel = 2, stride = kernel, pad = 0 (pad <= kernel / 2)
//   dropout: p = 0.5, in [0, 1)
//   relu, batchnorm, flatten: no keys
//   add, concat: inputs (required, two or more): the sum of equal shapes / the concatenation
//                along the channels
// Every type takes `name` (default: the layer's index, "0", "1", ..., like torch nn.Sequential;
// names are unique and contain no '.', since parameter names are "<name>.weight") and `inputs`
// (names of earlier layers; default: the previous layer), so the layers form a graph.
// LayerSpec (one entry of model.layers) lives with the models: models/model_spec.h.

// [model]: exactly one of `name` (a zoo model; validated by the zoo, not here), `layers`, or
// `onnx` (a file from torch.onnx.export; read by models/onnx when the model is built).
struct ModelConfig {
  std::string name;
  std::string onnx;
  int64_t classes = 10;  // >= 1
  std::vector<LayerSpec> layers;
  LossChoice loss = LossChoice::kAuto;
  // Activations channels-last (NHWC) between the layers that take them, on a backend that runs
  // them faster so (the CPU backend; Graph::set_channels_last): PyTorch's
  // model.to(memory_format=torch.channels_last). On by default (the CPU step is faster and needs
  // half the memory); false sums in the NCHW order.
  bool channels_last = true;

  bool operator==(const ModelConfig&) const = default;
};

// [data]
struct DataConfig {
  // Files or glob patterns, read as one dataset in order (OpenHdf5Datasets); a TOML string is a
  // list of one. train: required; ["synthetic"] = generated data, no file. test: empty = no
  // evaluation.
  std::vector<std::string> train;
  std::vector<std::string> test;
  std::vector<double> mean, std;  // per channel; same length or both empty; std entries > 0
  bool shuffle = true;
  Augment augment = Augment::kNone;
  int64_t crop = 0;     // >= 0; samples come out crop x crop (random-resized or centre crop)
  int64_t workers = 2;  // loader threads per rank; 0 = load in the training thread
  int64_t synthetic_samples = 8192;  // size of the "synthetic" data set (>= 1)
  CacheMode cache = CacheMode::kAuto;

  bool operator==(const DataConfig&) const = default;
};

// [train]: the length of the run, the batch, the optimizer and its schedule, precision, logging.
struct TrainLoopConfig {
  int64_t epochs = 5;          // >= 0
  int64_t max_steps = 0;       // >= 0; 0 = no limit. At least one of epochs / max_steps is > 0.
  int64_t global_batch = 128;  // >= 1, summed over ranks; divisible by accumulate
  int64_t accumulate = 1;      // micro-steps per optimizer step (>= 1)
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double lr = 0.05;       // > 0
  double momentum = 0.9;  // [0, 1); nesterov needs momentum > 0 with sgd
  bool nesterov = false;
  double weight_decay = 5e-4;  // >= 0
  // Parameters without weight decay: "bias" (every *.bias), "bn" (batch-norm weight and bias).
  std::vector<std::string> no_weight_decay;
  double beta1 = 0.9, beta2 = 0.999;  // adamw, in [0, 1)
  double eps = 1e-8;                  // adamw, > 0
  double lars_eta = 0.001;            // lars trust coefficient, > 0
  ScheduleKind schedule = ScheduleKind::kConstant;
  int64_t step_size = 0;  // step schedule: steps between decays (>= 0); 0 = one epoch
  double gamma = 0.1;     // step and multistep decay factor (> 0)
  // multistep: the epochs (after the warm-up; ascending, > 0) at which lr is multiplied by gamma
  std::vector<double> milestones;
  int64_t warmup_steps = 0;    // >= 0; not with onecycle (which warms up itself)
  double label_smoothing = 0;  // [0, 1): cross-entropy's, as F.cross_entropy(label_smoothing=)
  double clip_grad_norm = 0;   // >= 0; 0 = off: the global norm's limit, as clip_grad_norm_
  Precision precision = Precision::kF32;
  int64_t log_every_steps = 50;   // >= 1
  int64_t eval_every_epochs = 1;  // >= 0; 0 = never
  bool deterministic = false;
  bool cudnn_benchmark = false;  // CUDA: time cuDNN's convolution algorithms, take the fastest
  bool winograd = false;  // CPU: fp32 3x3 convolutions (>= 32 channels) by Winograd F(4x4, 3x3)
  // CUDA: fp32 convolutions may run TF32 on tensor cores (PyTorch's default for convolutions);
  // false: strict fp32. Linear layers stay fp32 either way (PyTorch's default for matmuls).
  bool tf32 = true;
  // Per graph node and op: time and calls after the first step, printed at the end and written
  // into metrics.jsonl (kind "profile"). Synchronises after every op: slower while on.
  bool profile = false;

  bool operator==(const TrainLoopConfig&) const = default;
};

// [checkpoint]
struct CheckpointConfig {
  int64_t every_steps = 0;      // >= 0; 0 = off
  int64_t every_epochs = 1;     // >= 0; 0 = off
  int64_t keep = 3;             // >= 1 most recent checkpoints kept
  std::string resume = "auto";  // "auto" (latest in run_dir, if any), "never", or a path
  std::string init;             // parameters-only initialisation; empty = none

  bool operator==(const CheckpointConfig&) const = default;
};

// [memory]
struct MemoryConfig {
  std::string limit;       // per-rank device budget as written ("2GiB"); empty = none
  size_t limit_bytes = 0;  // derived from `limit` by ParseByteSize; 0 = none. Not a key.
  bool auto_microbatch = false;
  // Activation recompute (Graph::set_recompute): about one more forward a step for much less
  // activation memory, the same numbers.
  bool recompute = false;

  bool operator==(const MemoryConfig&) const = default;
};

// [dist]
struct DistConfig {
  DeviceChoice device = DeviceChoice::kAuto;
  CommBackend backend = CommBackend::kAuto;  // nccl needs a cuda device
  BindingPolicy device_binding = BindingPolicy::kRemap;
  std::string gpus;                    // "2,3" (indices, UUIDs, MIG ids); empty = all visible
  int64_t bucket_mb = 25;              // >= 1
  double collective_timeout_s = 300;   // > 0
  int64_t threads = 0;                 // CPU threads per rank (>= 0); 0 = from affinity
  int64_t check_replicas_every = 100;  // steps between replica checksums (>= 0); 0 = never
  // ZeRO stage 1 ("optimizer": optimizer state sharded over the ranks) or 2 ("gradients": and
  // the reduced gradients); runtime/optim/shard_layout.h.
  ShardMode shard = ShardMode::kNone;

  bool operator==(const DistConfig&) const = default;
};

// The whole run configuration. Every field holds its effective value (defaults filled in).
struct TrainConfig {
  std::string run_dir = "runs/default";  // non-empty
  int64_t seed = 42;                     // >= 0
  ModelConfig model;
  DataConfig data;
  TrainLoopConfig train;
  CheckpointConfig checkpoint;
  MemoryConfig memory;
  DistConfig dist;
  std::string source;  // where it was read from: a path, or "<string>". Not a key.

  // Compares every field, `source` included.
  bool operator==(const TrainConfig&) const = default;
};

// data.train / data.test: whether it is the generated data set (["synthetic"]), and the entries
// as one text for messages ("a.h5", or "a.h5, b.h5" for several).
bool IsSynthetic(const std::vector<std::string>& files);
std::string DescribeFiles(const std::vector<std::string>& files);

// The loss a model trains with: model.loss, or for "auto" the zoo model's default
// (cross-entropy for model.layers).
LossKind ResolveLoss(const ModelConfig& m);

// The shape of one input sample when no data file says it (synthetic data, `dptrain plan`): the
// zoo model's default input, the ONNX file's input (ConfigError when it is not fixed there),
// (1, 28, 28) for model.layers.
Shape DefaultSampleShape(const ModelConfig& m);

// The model's graph from model.name, model.layers or model.onnx, for samples of shape `sample`
// (an ONNX file whose input disagrees with it is a ConfigError naming both).
std::unique_ptr<Graph> BuildNet(Backend& be, const ModelConfig& m, const MemoryConfig& mem,
                                const Shape& sample);

}  // namespace dptrain
