// SPDX-License-Identifier: Apache-2.0
// Small string helpers shared by every floor (header-only).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dptrain {

// `s` without leading and trailing white space (as std::isspace in the C locale).
inline std::string Trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\v\f\r";
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(kSpace);
  return std::string(s.substr(b, e - b + 1));
}

// The items separated by `sep`: Join({"a", "b"}, ", ") == "a, b".
inline std::string Join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += items[i];
  }
  return out;
}

// The lines of `s` split at '\n', as std::getline reads them: "" gives none, a final '\n' ends
// the last line. Class names in dataset and checkpoint files are stored this way.
inline std::vector<std::string> SplitLines(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const size_t nl = s.find('\n');
    out.emplace_back(s.substr(0, nl));
    if (nl == std::string_view::npos) break;
    s.remove_prefix(nl + 1);
  }
  return out;
}

}  // namespace dptrain
