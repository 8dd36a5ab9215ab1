// SPDX-License-Identifier: Apache-2.0
// Run configuration: TOML text (plus `--set dotted.key=value` overrides) -> a validated
// TrainConfig, and back to TOML. The key names are part of the interface (DESIGN.md section 7).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/run_config.h"

namespace dptrain {

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
