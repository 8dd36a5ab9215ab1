// SPDX-License-Identifier: Apache-2.0
// Private to launcher/ (include it only from launcher/config_*.cc; the interface is
// launcher/config.h): the table that maps every dotted config key to its TrainConfig field, and
// the helpers the parser, the validator and ToToml share, so that a key is declared once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/run_config.h"

namespace dptrain::config_detail {

// ---------------------------------------------------------------------------------------------
// Schema: dotted key -> accessor of the field it sets. The variant alternative is the key's type.

using IntRef = int64_t& (*)(TrainConfig&);
using FloatRef = double& (*)(TrainConfig&);
using BoolRef = bool& (*)(TrainConfig&);
using StringRef = std::string& (*)(TrainConfig&);
using FloatListRef = std::vector<double>& (*)(TrainConfig&);
using LayersRef = std::vector<LayerSpec>& (*)(TrainConfig&);
using StringListRef = std::vector<std::string>& (*)(TrainConfig&);
// A choice among named values: the enum's spellings (ConfigNames) and its value as an index.
struct EnumRef {
  std::span<const std::string_view> names;
  size_t (*get)(const TrainConfig&);
  void (*set)(TrainConfig&, size_t);
};
using FieldRef = std::variant<IntRef, FloatRef, BoolRef, StringRef, FloatListRef, LayersRef,
                              EnumRef, StringListRef>;

struct Field {
  std::string_view key;  // "train.lr"; no dot for top-level keys
  FieldRef ref;
};

// In ToToml order. memory.limit_bytes (derived) and source are not keys.
const std::vector<Field>& Schema();

// The tables a config file may have.
inline constexpr std::string_view kSections[] = {"model",      "data",   "train",
                                                 "checkpoint", "memory", "dist"};

// "an integer", "a number", ... for the key's type (messages).
std::string_view Expected(const FieldRef& ref);
const Field* FindField(std::string_view key);  // nullptr when `key` is not a key
bool IsSection(std::string_view name);
std::vector<std::string> AllKeys();  // every dotted key, in Schema() order

// Layer types and the keys each takes besides `type` and `name`, in ToToml order.
struct LayerType {
  std::string_view type;
  std::vector<std::string_view> keys;
  std::vector<std::string_view> required;
};

const std::vector<LayerType>& LayerTypes();
const LayerType* FindLayerType(std::string_view type);  // nullptr when unknown
const std::vector<std::string>& LayerKeys();            // every key a layer table may have

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// ---------------------------------------------------------------------------------------------
// Text helpers.

// A TOML basic string: "..." with the escapes TOML requires.
std::string Quote(std::string_view s);
// Shortest text that reads back as exactly `v` (std::to_chars), always with a '.' or exponent so
// TOML reads it as a float and not an integer.
std::string FormatFloat(double v);
std::string FormatFloatList(const std::vector<double>& values);  // "[0.5, 0.25]"
std::string JoinQuoted(const std::vector<std::string_view>& items);
std::string_view Leaf(std::string_view key);  // "train.lr" -> "lr"
// The candidate closest to `given` by edit distance if it is close (a typo), else one with the
// same last component (a key in the wrong table: "train.seed" -> "seed"), else "".
std::string Closest(std::string_view given, const std::vector<std::string>& candidates);
// " (did you mean 'x'?)" or "".
std::string DidYouMean(std::string_view given, const std::vector<std::string>& candidates,
                       std::string_view prefix = "");
// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Throws ConfigError "[rank r/w] WHERE: MESSAGE", WHERE being the config's own location
// ("configs/x.toml:7", "--set train.lr=abc"), never a line of this code.
[[noreturn]] void Fail(const std::string& where, const std::string& msg);

// ---------------------------------------------------------------------------------------------
// Where each key's effective value came from, so that every error can point at it.

class Origins {
 public:
  explicit Origins(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  // `key` now has the value given at `where` (its line or --set item).
  void Set(const std::string& key, const std::string& where) { origin_[key] = where; }
  // Origin of a key's effective value: its line or --set item, or the source for a default.
  const std::string& Where(std::string_view key) const;
  // Origin of the first of `keys` that was given explicitly; the source when none was.
  const std::string& WhereAny(std::initializer_list<std::string_view> keys) const;

 private:
  std::string source_;
  std::map<std::string, std::string, std::less<>> origin_;
};

// Checks every value's range and the rules between keys, after the file and every --set are
// applied; sets c.memory.limit_bytes from memory.limit. Fails naming the key and its origin.
void Validate(TrainConfig& c, const Origins& origins);

}  // namespace dptrain::config_detail
