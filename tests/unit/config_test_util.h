// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the config tests (config_test.cc, config_errors_test.cc,
// config_layers_test.cc): the smallest valid config, parsing it from a fixed source name, and the
// error a parse throws.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "launcher/config.h"

namespace dptrain {

inline constexpr char kSource[] = "configs/x.toml";

// The smallest valid config: a zoo model and synthetic data.
inline constexpr char kMinimal[] = R"(
[model]
name = "ref_cnn"
[data]
train = "synthetic"
)";

inline TrainConfig Parse(std::string_view text, const std::vector<std::string>& sets = {}) {
  return ParseConfig(text, kSource, sets);
}

// The ConfigError message that parsing `text` with `sets` throws ("" and a failure if none).
inline std::string ErrorOf(std::string_view text, const std::vector<std::string>& sets = {}) {
  try {
    Parse(text, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for:\n" << text;
  return "";
}

inline std::string MinimalWith(std::string_view extra) {
  return std::string(kMinimal) + std::string(extra);
}

}  // namespace dptrain
