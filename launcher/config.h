// SPDX-License-Identifier: Apache-2.0
// Run configuration: TOML text (plus `--set dotted.key=value` overrides) -> a validated
// TrainConfig, and back to TOML. The key names are part of the interface (DESIGN.md section 7).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/model_spec.h"

namespace dptrain {

// One entry of `model.layers`, e.g. {type = "conv2d", out = 32, kernel = 3, pad = 1}.
// Which keys a layer takes depends on its type; a key that does not apply to the type is an error:
//   conv2d:  out (required), kernel (required), stride = 1, pad = 0, bias = true
//   linear:  out (required), bias = true
//   maxpool, avgpool: kernel = 2, stride = kernel, pad = 0 (pad <= kernel / 2)
//   dropout: p = 0.5, in [0, 1)
//   relu, batchnorm, flatten: no keys
// Every type takes `name` (default: the layer's index, "0", "1", ..., like torch nn.Sequential;
// names are unique and contain no '.', since parameter names are "<name>.weight").
// LayerSpec (one entry of model.layers) lives with the models: models/model_spec.h.

// [model]: exactly one of `name` (a zoo model; validated by the zoo, not here) or `layers`.
struct ModelConfig {
  std::string name;
  int64_t classes = 10;  // >= 1
  std::vector<LayerSpec> layers;
  std::string loss = "auto";  // auto | cross_entropy | mse

  bool operator==(const ModelConfig&) const = default;
};

// [data]
struct DataConfig {
  std::string train;              // required; "synthetic" = generated data, no file
  std::string test;               // empty = no evaluation
  std::vector<double> mean, std;  // per channel; same length or both empty; std entries > 0
  bool shuffle = true;
  std::string augment = "none";      // none | crop-flip
  int64_t workers = 2;               // loader threads per rank; 0 = load in the training thread
  int64_t synthetic_samples = 8192;  // size of the "synthetic" data set (>= 1)
  std::string cache = "auto";        // auto | ram | chunks

  bool operator==(const DataConfig&) const = default;
};

// [train]
struct TrainSection {
  int64_t epochs = 5;             // >= 0
  int64_t max_steps = 0;          // >= 0; 0 = no limit. At least one of epochs / max_steps is > 0.
  int64_t global_batch = 128;     // >= 1, summed over ranks; divisible by accumulate
  int64_t accumulate = 1;         // micro-steps per optimizer step (>= 1)
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.05;               // > 0
  double momentum = 0.9;          // [0, 1); nesterov needs momentum > 0 with sgd
  bool nesterov = false;
  double weight_decay = 5e-4;         // >= 0
  double beta1 = 0.9, beta2 = 0.999;  // adamw, in [0, 1)
  double eps = 1e-8;                  // adamw, > 0
  std::string schedule = "constant";  // constant | step | cosine
  int64_t step_size = 0;              // step schedule: steps between decays (>= 0); 0 = one epoch
  double gamma = 0.1;                 // step schedule decay factor (> 0)
  int64_t warmup_steps = 0;           // >= 0
  std::string precision = "fp32";     // fp32 | bf16 | fp16
  int64_t log_every_steps = 50;       // >= 1
  int64_t eval_every_epochs = 1;      // >= 0; 0 = never
  bool deterministic = false;

  bool operator==(const TrainSection&) const = default;
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

  bool operator==(const MemoryConfig&) const = default;
};

// [dist]
struct DistConfig {
  std::string device = "auto";           // auto | cpu | cuda
  std::string backend = "auto";          // auto | mpi | nccl (nccl needs a cuda device)
  std::string device_binding = "remap";  // remap | set-device
  std::string gpus;                      // "2,3" (indices, UUIDs, MIG ids); empty = all visible
  int64_t bucket_mb = 25;                // >= 1
  double collective_timeout_s = 300;     // > 0
  int64_t threads = 0;                   // CPU threads per rank (>= 0); 0 = from affinity
  int64_t check_replicas_every = 100;    // steps between replica checksums (>= 0); 0 = never

  bool operator==(const DistConfig&) const = default;
};

// The whole run configuration. Every field holds its effective value (defaults filled in).
struct TrainConfig {
  std::string run_dir = "runs/default";  // non-empty
  int64_t seed = 42;                     // >= 0
  ModelConfig model;
  DataConfig data;
  TrainSection train;
  CheckpointConfig checkpoint;
  MemoryConfig memory;
  DistConfig dist;
  std::string source;  // where it was read from: a path, or "<string>". Not a key.

  // Compares every field, `source` included.
  bool operator==(const TrainConfig&) const = default;
};

// Parses and validates TOML text. `source` names the text in messages (a path; empty means
// "<string>") and is stored in TrainConfig::source. `sets` are "--set" items "dotted.key=value",
// applied in order after the file (a later item wins). A value is read as the key's type, so
// strings need no quotes ("data.train=/d/x.h5"; surrounding quotes are stripped if given) and
// other values are TOML ("train.lr=0.1", "train.nesterov=true", "data.mean=[0.5, 0.5]").
// `model.layers` cannot be set with --set.
//
// Throws ConfigError (exit code 2) on any problem; the message names the dotted key and where
// its value came from: "configs/x.toml:7: train.lr: expected a number, got string \"fast\"",
// "configs/x.toml:3: unknown key 'train.lrr' (did you mean 'train.lr'?)",
// "--set train.global_batch=0: train.global_batch must be >= 1, got 0". A value left at its
// default is attributed to the file ("configs/x.toml: data.train is required ...").
TrainConfig ParseConfig(std::string_view toml_text, const std::string& source,
                        const std::vector<std::string>& sets = {});

// Reads the file at `path` and parses it as ParseConfig(text, path, sets). A missing or
// unreadable file is a ConfigError naming the path.
TrainConfig LoadConfig(const std::string& path, const std::vector<std::string>& sets = {});

// The configuration as TOML text: every key with its effective value, in a fixed order, floats
// written so that they read back exactly. ParseConfig(ToToml(c), c.source) == c for any valid c.
// `source` and `memory.limit_bytes` are not keys and are not written. This is what a run saves
// as run_dir/config.toml and in its checkpoints.
std::string ToToml(const TrainConfig& c);

// 64-bit FNV-1a hash of ToToml(c): stable across processes, builds and hosts, so ranks can
// agree that they run the same configuration. Independent of `source`.
uint64_t ConfigHash(const TrainConfig& c);

}  // namespace dptrain
