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

}  // namespace dptrain
