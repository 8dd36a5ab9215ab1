// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the config parser (TOML text + `--set` items) -> a validated TrainConfig.
// Input: TOML text; after a line "%%", each further line is one --set item (at most 8).
// A ConfigError is the only acceptable failure; a config that parses must survive the
// ToToml -> ParseConfig round trip unchanged (launcher/config.h promises it).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "launcher/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view toml = input;
  std::vector<std::string> sets;
  size_t at = std::string_view::npos;
  if (input.starts_with("%%\n")) {
    at = 0;
  } else if (const size_t p = input.find("\n%%\n"); p != std::string_view::npos) {
    at = p + 1;
  }
  if (at != std::string_view::npos) {
    toml = input.substr(0, at);
    std::string_view rest = input.substr(at + 3);
    while (!rest.empty() && sets.size() < 8) {
      const size_t nl = rest.find('\n');
      sets.emplace_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
  }
  dptrain::TrainConfig config;
  try {
    config = dptrain::ParseConfig(toml, "fuzz.toml", sets);
  } catch (const dptrain::ConfigError&) {
    return 0;
  }
  // A valid config round-trips exactly; anything else is a bug (any exception escapes).
  const dptrain::TrainConfig again = dptrain::ParseConfig(dptrain::ToToml(config), "fuzz.toml");
  if (!(again == config)) {
    std::fprintf(stderr, "ToToml/ParseConfig round trip changed the config:\n%s\n---\n%s\n",
                 dptrain::ToToml(config).c_str(), dptrain::ToToml(again).c_str());
    std::abort();
  }
  return 0;
}
