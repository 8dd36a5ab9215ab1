// SPDX-License-Identifier: Apache-2.0
// TOML -> TrainConfig. One table (Schema) maps every dotted key to its TrainConfig field; the file
// reader, --set and ToToml all walk it, so a key is declared once. Validation runs after the file
// and every override are applied and names where the offending value came from.
#include "launcher/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <span>
#include <sstream>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "core/memory/caching_allocator.h"
#include "core/util/strings.h"

namespace dptrain {
namespace {

// ---------------------------------------------------------------------------------------------
// Schema: dotted key -> accessor of the field it sets. The variant alternative is the key's type.

using IntRef = int64_t& (*)(TrainConfig&);
using FloatRef = double& (*)(TrainConfig&);
using BoolRef = bool& (*)(TrainConfig&);
using StringRef = std::string& (*)(TrainConfig&);
using FloatListRef = std::vector<double>& (*)(TrainConfig&);
using LayersRef = std::vector<LayerSpec>& (*)(TrainConfig&);
// A choice among named values: the enum's spellings (ConfigNames) and its value as an index.
struct EnumRef {
  std::span<const std::string_view> names;
  size_t (*get)(const TrainConfig&);
  void (*set)(TrainConfig&, size_t);
};
using FieldRef =
    std::variant<IntRef, FloatRef, BoolRef, StringRef, FloatListRef, LayersRef, EnumRef>;

struct Field {
  std::string_view key;  // "train.lr"; no dot for top-level keys
  FieldRef ref;
};

// The member path is the dotted key: DPT_CONFIG_FIELD(train.lr) declares "train.lr".
#define DPT_CONFIG_FIELD(member)                                               \
  Field {                                                                      \
#member, +[](TrainConfig & c) -> decltype((c.member)) { return c.member; } \
  }

// DPT_CONFIG_ENUM(train.optimizer): a key whose value is one of an enum's ConfigNames.
#define DPT_CONFIG_ENUM(member)                                                 \
  Field {                                                                       \
#member, EnumRef {                                                          \
      ConfigNames<std::remove_cvref_t<decltype(TrainConfig{}.member)>>::kNames, \
          +[](const TrainConfig& c) { return static_cast<size_t>(c.member); },  \
          +[](TrainConfig& c, size_t v) {                                       \
            c.member = static_cast<std::remove_cvref_t<decltype(c.member)>>(v); \
          }                                                                     \
    }                                                                           \
  }

// In ToToml order. memory.limit_bytes (derived) and source are not keys.
const std::vector<Field>& Schema() {
  static const std::vector<Field> fields = {
      DPT_CONFIG_FIELD(run_dir),
      DPT_CONFIG_FIELD(seed),
      DPT_CONFIG_FIELD(model.name),
      DPT_CONFIG_FIELD(model.classes),
      DPT_CONFIG_ENUM(model.loss),
      DPT_CONFIG_FIELD(model.layers),
      DPT_CONFIG_FIELD(data.train),
      DPT_CONFIG_FIELD(data.test),
      DPT_CONFIG_FIELD(data.mean),
      DPT_CONFIG_FIELD(data.std),
      DPT_CONFIG_FIELD(data.shuffle),
      DPT_CONFIG_ENUM(data.augment),
      DPT_CONFIG_FIELD(data.workers),
      DPT_CONFIG_FIELD(data.synthetic_samples),
      DPT_CONFIG_ENUM(data.cache),
      DPT_CONFIG_FIELD(train.epochs),
      DPT_CONFIG_FIELD(train.max_steps),
      DPT_CONFIG_FIELD(train.global_batch),
      DPT_CONFIG_FIELD(train.accumulate),
      DPT_CONFIG_ENUM(train.optimizer),
      DPT_CONFIG_FIELD(train.lr),
      DPT_CONFIG_FIELD(train.momentum),
      DPT_CONFIG_FIELD(train.nesterov),
      DPT_CONFIG_FIELD(train.weight_decay),
      DPT_CONFIG_FIELD(train.beta1),
      DPT_CONFIG_FIELD(train.beta2),
      DPT_CONFIG_FIELD(train.eps),
      DPT_CONFIG_ENUM(train.schedule),
      DPT_CONFIG_FIELD(train.step_size),
      DPT_CONFIG_FIELD(train.gamma),
      DPT_CONFIG_FIELD(train.warmup_steps),
      DPT_CONFIG_ENUM(train.precision),
      DPT_CONFIG_FIELD(train.log_every_steps),
      DPT_CONFIG_FIELD(train.eval_every_epochs),
      DPT_CONFIG_FIELD(train.deterministic),
      DPT_CONFIG_FIELD(checkpoint.every_steps),
      DPT_CONFIG_FIELD(checkpoint.every_epochs),
      DPT_CONFIG_FIELD(checkpoint.keep),
      DPT_CONFIG_FIELD(checkpoint.resume),
      DPT_CONFIG_FIELD(checkpoint.init),
      DPT_CONFIG_FIELD(memory.limit),
      DPT_CONFIG_FIELD(memory.auto_microbatch),
      DPT_CONFIG_ENUM(dist.device),
      DPT_CONFIG_ENUM(dist.backend),
      DPT_CONFIG_ENUM(dist.device_binding),
      DPT_CONFIG_FIELD(dist.gpus),
      DPT_CONFIG_FIELD(dist.bucket_mb),
      DPT_CONFIG_FIELD(dist.collective_timeout_s),
      DPT_CONFIG_FIELD(dist.threads),
      DPT_CONFIG_FIELD(dist.check_replicas_every),
  };
  return fields;
}
#undef DPT_CONFIG_FIELD
#undef DPT_CONFIG_ENUM

constexpr std::string_view kSections[] = {"model", "data", "train", "checkpoint", "memory", "dist"};

// "an integer", ... indexed like FieldRef's alternatives.
std::string_view Expected(const FieldRef& ref) {
  static constexpr std::string_view kNames[] = {"an integer",
                                                "a number",
                                                "a boolean",
                                                "a string",
                                                "an array of numbers",
                                                "an array of layer tables",
                                                "a string"};
  return kNames[ref.index()];
}

const Field* FindField(std::string_view key) {
  for (const Field& f : Schema()) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

bool IsSection(std::string_view name) {
  return std::find(std::begin(kSections), std::end(kSections), name) != std::end(kSections);
}

std::vector<std::string> AllKeys() {
  std::vector<std::string> keys;
  for (const Field& f : Schema()) keys.emplace_back(f.key);
  return keys;
}

// Layer types and the keys each takes besides `type` and `name`, in ToToml order.
struct LayerType {
  std::string_view type;
  std::vector<std::string_view> keys;
  std::vector<std::string_view> required;
};

const std::vector<LayerType>& LayerTypes() {
  static const std::vector<LayerType> types = {
      {"conv2d", {"out", "kernel", "stride", "pad", "bias"}, {"out", "kernel"}},
      {"linear", {"out", "bias"}, {"out"}},
      {"relu", {}, {}},
      {"maxpool", {"kernel", "stride", "pad"}, {}},
      {"avgpool", {"kernel", "stride", "pad"}, {}},
      {"batchnorm", {}, {}},
      {"dropout", {"p"}, {}},
      {"flatten", {}, {}},
  };
  return types;
}

const LayerType* FindLayerType(std::string_view type) {
  for (const LayerType& t : LayerTypes()) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

const std::vector<std::string>& LayerKeys() {
  static const std::vector<std::string> keys = {"type",   "name", "out",  "kernel",
                                                "stride", "pad",  "bias", "p"};
  return keys;
}

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// ---------------------------------------------------------------------------------------------
// Text helpers.

// A TOML basic string: "..." with the escapes TOML requires.
std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", u);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// Shortest text that reads back as exactly `v` (std::to_chars), always with a '.' or exponent so
// TOML reads it as a float and not an integer.
std::string FormatFloat(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // 'n': inf, nan
  return s;
}

// "[0.5, 0.25]"
std::string FormatFloatList(const std::vector<double>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i > 0 ? ", " : "") + FormatFloat(values[i]);
  return out + "]";
}

std::string JoinQuoted(const std::vector<std::string_view>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + Quote(item);
  return out;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string_view Leaf(std::string_view key) {
  const size_t dot = key.rfind('.');
  return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

// The candidate closest to `given` by edit distance if it is close (a typo), else one with the same
// last component (a key in the wrong table: "train.seed" -> "seed"), else "".
std::string Closest(std::string_view given, const std::vector<std::string>& candidates) {
  const size_t leaf = Leaf(given).size();
  const size_t threshold = leaf <= 3 ? 1 : (leaf <= 8 ? 2 : 3);
  size_t best = threshold + 1;
  std::string best_key;
  for (const auto& c : candidates) {
    const size_t d = EditDistance(given, c);
    if (d < best) {
      best = d;
      best_key = c;
    }
  }
  if (!best_key.empty()) return best_key;
  for (const auto& c : candidates) {
    if (Leaf(c) == Leaf(given)) return c;
  }
  return "";
}

// " (did you mean 'x'?)" or "".
std::string DidYouMean(std::string_view given, const std::vector<std::string>& candidates,
                       std::string_view prefix = "") {
  const std::string best = Closest(given, candidates);
  return best.empty() ? "" : " (did you mean '" + std::string(prefix) + best + "'?)";
}

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF). TOML files are UTF-8 by definition (toml++ checks); --set strings are taken as
// written, so they are checked here: a value ToToml cannot write back would make the saved
// config.toml unreadable.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07u;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(extra) >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(extra) + 1;
  }
  return true;
}

// What a node holds, for "expected X, got Y": `string "fast"`, `float 1.5`, `a table`.
std::string Describe(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "string " + Quote(n.as_string()->get());
    case toml::node_type::integer:
      return "integer " + std::to_string(n.as_integer()->get());
    case toml::node_type::floating_point:
      return "float " + FormatFloat(n.as_floating_point()->get());
    case toml::node_type::boolean:
      return n.as_boolean()->get() ? "boolean true" : "boolean false";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

// Every config error is raised here as "[rank r/w] WHERE: MESSAGE", WHERE being the config's own
// location ("configs/x.toml:7", "--set train.lr=abc"). DPT_THROW would add this file's line, the
// same for every error and a second, confusing location in a message about the user's file.
[[noreturn]] void Fail(const std::string& where, const std::string& msg) {
  throw ConfigError(RankTag() + where + ": " + msg);
}

// ---------------------------------------------------------------------------------------------
// Typed reads of one TOML node for `key`; `where` is its origin ("configs/x.toml:7").

int64_t ReadInt(const toml::node& n, const std::string& key, const std::string& where) {
  if (const auto* v = n.as_integer()) return v->get();
  std::string hint;
  if (const auto* f = n.as_floating_point();
      f && std::isfinite(f->get()) && std::trunc(f->get()) == f->get()) {
    hint = "; hint: write it without a decimal point";
  }
  Fail(where, key + ": expected an integer, got " + Describe(n) + hint);
}

double ReadFloat(const toml::node& n, const std::string& key, const std::string& where) {
  if (const auto* v = n.as_integer()) return static_cast<double>(v->get());
  if (const auto* v = n.as_floating_point()) {
    if (!std::isfinite(v->get())) {
      Fail(where, key + ": expected a finite number, got " + Describe(n));
    }
    return v->get();
  }
  Fail(where, key + ": expected a number, got " + Describe(n));
}

bool ReadBool(const toml::node& n, const std::string& key, const std::string& where) {
  if (const auto* v = n.as_boolean()) return v->get();
  Fail(where, key + ": expected a boolean (true or false), got " + Describe(n));
}

std::string ReadString(const toml::node& n, const std::string& key, const std::string& where) {
  if (const auto* v = n.as_string()) return v->get();
  Fail(where,
       key + ": expected a string, got " + Describe(n) + "; hint: strings are quoted in TOML");
}

std::vector<double> ReadFloatList(const toml::node& n, const std::string& key,
                                  const std::string& where) {
  const auto* arr = n.as_array();
  if (arr == nullptr) {
    Fail(where, key + ": expected an array of numbers like [0.5], got " + Describe(n));
  }
  std::vector<double> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    out.push_back(ReadFloat((*arr)[i], key + "[" + std::to_string(i) + "]", where));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The parser: reads the file, applies overrides, validates. Remembers where each key's value came
// from so that every error can point at it.

class ConfigParser {
 public:
  explicit ConfigParser(const std::string& source) : source_(source.empty() ? "<string>" : source) {
    cfg_.source = source_;
  }

  void ParseText(std::string_view text);
  void ApplySet(const std::string& item);
  void Validate();
  TrainConfig Take() { return std::move(cfg_); }

 private:
  // "configs/x.toml:7" for a region (the key's own line when known), else the source alone.
  std::string At(const toml::source_region& key, const toml::source_region& value) const {
    const auto line = key.begin.line > 0 ? key.begin.line : value.begin.line;
    return line > 0 ? source_ + ":" + std::to_string(line) : source_;
  }
  // Origin of a key's effective value: its line or --set item, or the source for a default.
  const std::string& Where(std::string_view key) const {
    const auto it = origin_.find(key);
    return it == origin_.end() ? source_ : it->second;
  }
  // Origin of the first of `keys` that was given explicitly.
  const std::string& WhereAny(std::initializer_list<std::string_view> keys) const {
    for (const auto key : keys) {
      if (origin_.count(key) > 0) return Where(key);
    }
    return source_;
  }

  void Assign(const Field& f, const toml::node& n, const std::string& where);
  std::vector<LayerSpec> ParseLayers(const toml::node& n, const std::string& where) const;
  LayerSpec ParseLayer(const toml::node& n, size_t index, const std::string& array_where) const;

  // Range checks: fail naming the key and its origin.
  void AtLeast(std::string_view key, int64_t v, int64_t min) const;
  void Positive(std::string_view key, double v) const;
  void NonNegative(std::string_view key, double v) const;
  void UnitInterval(std::string_view key, double v) const;  // [0, 1)
  // The index of `v` among an enum key's spellings; anything else fails naming them.
  size_t Choice(const EnumRef& r, const std::string& v, const std::string& key,
                const std::string& where) const;
  size_t ReadChoice(const EnumRef& r, const toml::node& n, const std::string& key,
                    const std::string& where) const {
    return Choice(r, ReadString(n, key, where), key, where);
  }

  std::string source_;
  TrainConfig cfg_;
  std::map<std::string, std::string, std::less<>> origin_;
};

void ConfigParser::ParseText(std::string_view text) {
  toml::table root;
  try {
    root = toml::parse(text, source_);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    std::string msg = "TOML syntax error: " + std::string(e.description());
    if (e.description().find("could not determine value type") != std::string_view::npos) {
      msg += "; hint: strings are quoted in the file (train = \"data/train.h5\")";
    }
    Fail(source_ + ":" + std::to_string(b.line) + ":" + std::to_string(b.column), msg);
  }
  for (auto&& [k, node] : root) {
    const std::string key(k.str());
    const std::string where = At(k.source(), node.source());
    if (IsSection(key)) {
      const auto* table = node.as_table();
      if (table == nullptr) {
        Fail(where, "'" + key + "' must be a table ([" + key + "]), got " + Describe(node));
      }
      for (auto&& [sub_key, sub_node] : *table) {
        const std::string full = key + "." + std::string(sub_key.str());
        const std::string sub_where = At(sub_key.source(), sub_node.source());
        const Field* f = FindField(full);
        if (f == nullptr) {
          Fail(sub_where, "unknown key '" + full + "'" + DidYouMean(full, AllKeys()));
        }
        Assign(*f, sub_node, sub_where);
      }
    } else if (const Field* f = FindField(key)) {
      Assign(*f, node, where);
    } else if (node.is_table()) {
      std::vector<std::string> sections(std::begin(kSections), std::end(kSections));
      std::string msg = "unknown table '[" + key + "]'";
      const std::string best = Closest(key, sections);
      if (!best.empty()) msg += " (did you mean '[" + best + "]'?)";
      Fail(where,
           msg + "; the tables are [model], [data], [train], [checkpoint], [memory], [dist]");
    } else {
      Fail(where, "unknown key '" + key + "'" + DidYouMean(key, AllKeys()));
    }
  }
}

void ConfigParser::Assign(const Field& f, const toml::node& n, const std::string& where) {
  const std::string key(f.key);
  std::visit(Overloaded{
                 [&](IntRef r) { r(cfg_) = ReadInt(n, key, where); },
                 [&](FloatRef r) { r(cfg_) = ReadFloat(n, key, where); },
                 [&](BoolRef r) { r(cfg_) = ReadBool(n, key, where); },
                 [&](StringRef r) { r(cfg_) = ReadString(n, key, where); },
                 [&](FloatListRef r) { r(cfg_) = ReadFloatList(n, key, where); },
                 [&](LayersRef r) { r(cfg_) = ParseLayers(n, where); },
                 [&](const EnumRef& r) { r.set(cfg_, ReadChoice(r, n, key, where)); },
             },
             f.ref);
  origin_[key] = where;
}

void ConfigParser::ApplySet(const std::string& item) {
  const std::string where = "--set " + item;
  const size_t eq = item.find('=');
  if (eq == std::string::npos) {
    Fail(where, "expected key=value, e.g. --set train.lr=0.1");
  }
  const std::string key = Trim(std::string_view(item).substr(0, eq));
  const std::string value = Trim(std::string_view(item).substr(eq + 1));
  if (key.empty()) Fail(where, "missing key before '=', e.g. --set train.lr=0.1");
  const Field* f = FindField(key);
  if (f == nullptr && key.rfind("model.layers", 0) == 0) f = FindField("model.layers");
  if (f == nullptr) Fail(where, "unknown key '" + key + "'" + DidYouMean(key, AllKeys()));
  if (std::holds_alternative<LayersRef>(f->ref)) {
    Fail(where,
         "model.layers cannot be set with --set; edit the layers in the config file, or pick a "
         "zoo model with --set model.name=NAME");
  }

  if (std::holds_alternative<StringRef>(f->ref) || std::holds_alternative<EnumRef>(f->ref)) {
    // Strings are taken as written; quotes are optional.
    std::string s = value;
    if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) {
      s = s.substr(1, s.size() - 2);
    }
    if (!IsValidUtf8(s)) Fail(where, key + ": the value is not valid UTF-8 text");
    if (const auto* e = std::get_if<EnumRef>(&f->ref)) {
      e->set(cfg_, Choice(*e, s, key, where));
    } else {
      std::get<StringRef>(f->ref)(cfg_) = s;
    }
    origin_[key] = where;
    // Choosing a zoo model on the command line replaces a layer list from the file.
    if (key == "model.name" && !s.empty()) cfg_.model.layers.clear();
    return;
  }

  // Everything else is a TOML value of the key's type.
  toml::table parsed;
  try {
    const std::string doc = "v = " + value;
    parsed = toml::parse(doc, std::string_view("--set"));
  } catch (const toml::parse_error&) {
    Fail(where, key + ": expected " + std::string(Expected(f->ref)) + ", got '" + value + "'");
  }
  const toml::node* node = parsed.get("v");
  if (node == nullptr || parsed.size() != 1) {
    Fail(where, key + ": expected a single value, got '" + value + "'");
  }
  Assign(*f, *node, where);
}

std::vector<LayerSpec> ConfigParser::ParseLayers(const toml::node& n,
                                                 const std::string& where) const {
  const auto* arr = n.as_array();
  if (arr == nullptr) {
    Fail(where,
         "model.layers: expected an array of layer tables like [{type = \"linear\", out = 10}], "
         "got " +
             Describe(n));
  }
  if (arr->empty()) Fail(where, "model.layers is empty; list at least one layer or set model.name");
  std::vector<LayerSpec> layers;
  std::map<std::string, size_t> index_of_name;
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::node& el = (*arr)[i];
    layers.push_back(ParseLayer(el, i, where));
    const auto [it, inserted] = index_of_name.emplace(layers.back().name, i);
    if (!inserted) {
      Fail(At({}, el.source()), "model.layers[" + std::to_string(i) + "].name \"" +
                                    layers.back().name + "\" is already used by model.layers[" +
                                    std::to_string(it->second) + "]; layer names must be unique");
    }
  }
  return layers;
}

LayerSpec ConfigParser::ParseLayer(const toml::node& n, size_t index,
                                   const std::string& array_where) const {
  const std::string base = "model.layers[" + std::to_string(index) + "]";
  const std::string where = n.source().begin.line > 0 ? At({}, n.source()) : array_where;
  const auto* table = n.as_table();
  if (table == nullptr) {
    Fail(where, base + ": expected a table like {type = \"relu\"}, got " + Describe(n));
  }

  LayerSpec l;
  l.name = std::to_string(index);            // like torch nn.Sequential
  std::map<std::string, std::string> given;  // key -> where
  for (auto&& [k, v] : *table) {
    const std::string key(k.str());
    const std::string full = base + "." + key;
    const std::string w = At(k.source(), v.source());
    if (key == "type") {
      l.type = ReadString(v, full, w);
    } else if (key == "name") {
      l.name = ReadString(v, full, w);
    } else if (key == "out") {
      l.out = ReadInt(v, full, w);
    } else if (key == "kernel") {
      l.kernel = ReadInt(v, full, w);
    } else if (key == "stride") {
      l.stride = ReadInt(v, full, w);
    } else if (key == "pad") {
      l.pad = ReadInt(v, full, w);
    } else if (key == "bias") {
      l.bias = ReadBool(v, full, w);
    } else if (key == "p") {
      l.p = ReadFloat(v, full, w);
    } else {
      Fail(w, "unknown key '" + full + "'" + DidYouMean(key, LayerKeys(), base + "."));
    }
    given[key] = w;
  }

  std::vector<std::string_view> type_names;
  for (const LayerType& t : LayerTypes()) type_names.push_back(t.type);
  if (given.count("type") == 0) {
    Fail(where, base + ": missing key 'type' (one of " + JoinQuoted(type_names) + ")");
  }
  const LayerType* type = FindLayerType(l.type);
  if (type == nullptr) {
    std::vector<std::string> names(type_names.begin(), type_names.end());
    const std::string best = Closest(l.type, names);
    Fail(given["type"], base + ".type: unknown layer type " + Quote(l.type) +
                            (best.empty() ? "" : " (did you mean " + Quote(best) + "?)") +
                            "; one of " + JoinQuoted(type_names));
  }
  for (const auto& [key, w] : given) {
    if (key == "type" || key == "name") continue;
    if (std::find(type->keys.begin(), type->keys.end(), key) == type->keys.end()) {
      std::string takes = "takes no keys besides type and name";
      if (!type->keys.empty()) {
        takes = "takes";
        for (const auto k : type->keys) takes += (takes == "takes" ? " " : ", ") + std::string(k);
      }
      Fail(w, base + "." + key + " does not apply to a " + l.type + " layer (" + l.type + " " +
                  takes + ")");
    }
  }
  for (const auto key : type->required) {
    if (given.count(std::string(key)) == 0) {
      Fail(where, base + "." + std::string(key) + " is required for a " + l.type + " layer");
    }
  }

  // Where a checked key's value came from (the layer's line when it took a default).
  const auto at = [&](const std::string& key) {
    const auto it = given.find(key);
    return it == given.end() ? where : it->second;
  };
  const bool pool = l.type == "maxpool" || l.type == "avgpool";
  if (pool) {
    if (given.count("kernel") == 0) l.kernel = 2;
    if (given.count("stride") == 0) l.stride = l.kernel;
  }
  const auto applies = [&](std::string_view key) {
    return std::find(type->keys.begin(), type->keys.end(), key) != type->keys.end();
  };
  const auto at_least = [&](const std::string& key, int64_t v, int64_t min) {
    if (v < min) {
      Fail(at(key),
           base + "." + key + " must be >= " + std::to_string(min) + ", got " + std::to_string(v));
    }
  };
  if (applies("out")) at_least("out", l.out, 1);
  if (applies("kernel")) at_least("kernel", l.kernel, 1);
  if (applies("stride")) at_least("stride", l.stride, 1);
  if (applies("pad")) at_least("pad", l.pad, 0);
  if (pool && 2 * l.pad > l.kernel) {
    Fail(at("pad"), base + ".pad must be <= kernel / 2 (" + std::to_string(l.kernel / 2) +
                        "), got " + std::to_string(l.pad));
  }
  if (applies("p") && !(l.p >= 0 && l.p < 1)) {
    Fail(at("p"), base + ".p must be in [0, 1), got " + FormatFloat(l.p));
  }
  if (l.name.empty() || l.name.find('.') != std::string::npos) {
    Fail(at("name"), base +
                         ".name must be non-empty and contain no '.' (parameters are named "
                         "<name>.weight), got " +
                         Quote(l.name));
  }
  return l;
}

void ConfigParser::AtLeast(std::string_view key, int64_t v, int64_t min) const {
  if (v < min) {
    Fail(Where(key),
         std::string(key) + " must be >= " + std::to_string(min) + ", got " + std::to_string(v));
  }
}

void ConfigParser::Positive(std::string_view key, double v) const {
  if (!(v > 0)) Fail(Where(key), std::string(key) + " must be > 0, got " + FormatFloat(v));
}

void ConfigParser::NonNegative(std::string_view key, double v) const {
  if (!(v >= 0)) Fail(Where(key), std::string(key) + " must be >= 0, got " + FormatFloat(v));
}

void ConfigParser::UnitInterval(std::string_view key, double v) const {
  if (!(v >= 0 && v < 1)) {
    Fail(Where(key), std::string(key) + " must be in [0, 1), got " + FormatFloat(v));
  }
}

size_t ConfigParser::Choice(const EnumRef& r, const std::string& v, const std::string& key,
                            const std::string& where) const {
  const auto it = std::find(r.names.begin(), r.names.end(), v);
  if (it != r.names.end()) return static_cast<size_t>(it - r.names.begin());
  const std::vector<std::string_view> allowed(r.names.begin(), r.names.end());
  const std::vector<std::string> names(allowed.begin(), allowed.end());
  const std::string best = Closest(v, names);
  Fail(where, key + " must be one of " + JoinQuoted(allowed) + ", got " + Quote(v) +
                  (best.empty() ? "" : " (did you mean " + Quote(best) + "?)"));
}

void ConfigParser::Validate() {
  TrainConfig& c = cfg_;
  if (c.run_dir.empty()) Fail(Where("run_dir"), "run_dir must not be empty");
  AtLeast("seed", c.seed, 0);

  // [model]
  const bool has_name = !c.model.name.empty();
  const bool has_layers = !c.model.layers.empty();
  if (has_name && has_layers) {
    Fail(WhereAny({"model.name", "model.layers"}),
         "model.name and model.layers are both set; give one: a zoo model name or a list of "
         "layers");
  }
  if (!has_name && !has_layers) {
    Fail(WhereAny({"model.name", "model.layers"}),
         "no model: set model.name (a zoo model, e.g. \"ref_cnn\") or model.layers (a list of "
         "layers)");
  }
  AtLeast("model.classes", c.model.classes, 1);

  // [data]
  if (c.data.train.empty()) {
    Fail(Where("data.train"),
         "data.train is required: an HDF5 file (see `dptrain convert`) or \"synthetic\"");
  }
  if (c.data.mean.size() != c.data.std.size()) {
    Fail(WhereAny({"data.std", "data.mean"}),
         "data.mean has " + std::to_string(c.data.mean.size()) + " entries but data.std has " +
             std::to_string(c.data.std.size()) + "; give one per channel for both, or neither");
  }
  for (size_t i = 0; i < c.data.std.size(); ++i) {
    if (!(c.data.std[i] > 0)) {
      Fail(Where("data.std"),
           "data.std[" + std::to_string(i) + "] must be > 0, got " + FormatFloat(c.data.std[i]));
    }
  }
  AtLeast("data.workers", c.data.workers, 0);
  AtLeast("data.synthetic_samples", c.data.synthetic_samples, 1);

  // [train]
  const TrainLoopConfig& t = c.train;
  AtLeast("train.epochs", t.epochs, 0);
  AtLeast("train.max_steps", t.max_steps, 0);
  if (t.epochs == 0 && t.max_steps == 0) {
    Fail(WhereAny({"train.epochs", "train.max_steps"}),
         "train.epochs and train.max_steps are both 0, so there is nothing to train; set one of "
         "them > 0");
  }
  AtLeast("train.global_batch", t.global_batch, 1);
  AtLeast("train.accumulate", t.accumulate, 1);
  if (t.global_batch % t.accumulate != 0) {
    Fail(WhereAny({"train.accumulate", "train.global_batch"}),
         "train.global_batch (" + std::to_string(t.global_batch) +
             ") must be divisible by train.accumulate (" + std::to_string(t.accumulate) +
             "); each optimizer step runs accumulate micro-batches of global_batch / accumulate");
  }
  Positive("train.lr", t.lr);
  UnitInterval("train.momentum", t.momentum);
  if (t.nesterov && t.optimizer == OptimizerKind::kSgd && t.momentum == 0) {
    Fail(WhereAny({"train.nesterov", "train.momentum"}),
         "train.nesterov = true needs train.momentum > 0");
  }
  NonNegative("train.weight_decay", t.weight_decay);
  UnitInterval("train.beta1", t.beta1);
  UnitInterval("train.beta2", t.beta2);
  Positive("train.eps", t.eps);
  AtLeast("train.step_size", t.step_size, 0);
  Positive("train.gamma", t.gamma);
  AtLeast("train.warmup_steps", t.warmup_steps, 0);
  AtLeast("train.log_every_steps", t.log_every_steps, 1);
  AtLeast("train.eval_every_epochs", t.eval_every_epochs, 0);

  // [checkpoint]
  AtLeast("checkpoint.every_steps", c.checkpoint.every_steps, 0);
  AtLeast("checkpoint.every_epochs", c.checkpoint.every_epochs, 0);
  AtLeast("checkpoint.keep", c.checkpoint.keep, 1);
  if (c.checkpoint.resume.empty()) {
    Fail(Where("checkpoint.resume"),
         "checkpoint.resume must be \"auto\", \"never\" or a checkpoint path, got \"\"");
  }

  // [memory]
  c.memory.limit_bytes = 0;
  if (!c.memory.limit.empty()) {
    try {
      c.memory.limit_bytes = ParseByteSize(c.memory.limit, "memory.limit");
    } catch (const ConfigError&) {
      Fail(Where("memory.limit"), "memory.limit: " + Quote(c.memory.limit) +
                                      " is not a positive size (examples: \"512MiB\", \"2GiB\", "
                                      "\"1048576\"; \"\" = no limit)");
    }
  }

  // [dist]
  const DistConfig& d = c.dist;
  if (d.backend == CommBackend::kNccl && d.device == DeviceChoice::kCpu) {
    Fail(WhereAny({"dist.backend", "dist.device"}),
         "dist.backend = \"nccl\" needs GPUs, but dist.device = \"cpu\"; use backend \"mpi\" or "
         "\"auto\"");
  }
  // dist.gpus: "2,3", UUIDs or MIG ids; the binder resolves them, here only the list's shape.
  for (size_t start = 0; !d.gpus.empty();) {
    const size_t comma = d.gpus.find(',', start);
    if (Trim(std::string_view(d.gpus).substr(start, comma - start)).empty()) {
      Fail(Where("dist.gpus"), "dist.gpus: empty entry in " + Quote(d.gpus) +
                                   "; expected a comma-separated list like \"2,3\"");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  AtLeast("dist.bucket_mb", d.bucket_mb, 1);
  Positive("dist.collective_timeout_s", d.collective_timeout_s);
  AtLeast("dist.threads", d.threads, 0);
  AtLeast("dist.check_replicas_every", d.check_replicas_every, 0);
}

// ---------------------------------------------------------------------------------------------
// ToToml helpers.

std::string FormatValue(const FieldRef& ref, TrainConfig& c) {
  return std::visit(Overloaded{
                        [&](IntRef r) { return std::to_string(r(c)); },
                        [&](FloatRef r) { return FormatFloat(r(c)); },
                        [&](BoolRef r) { return std::string(r(c) ? "true" : "false"); },
                        [&](StringRef r) { return Quote(r(c)); },
                        [&](FloatListRef r) { return FormatFloatList(r(c)); },
                        [&](LayersRef) { return std::string(); },  // written by FormatLayer
                        [&](const EnumRef& r) { return Quote(r.names[r.get(c)]); },
                    },
                    ref);
}

// One layer as an inline table: type, name, then the keys its type takes.
std::string FormatLayer(const LayerSpec& l) {
  std::string out = "{ type = " + Quote(l.type) + ", name = " + Quote(l.name);
  static const std::vector<std::string_view> kAll = {"out", "kernel", "stride", "pad", "bias", "p"};
  const LayerType* type = FindLayerType(l.type);
  for (const auto key : type != nullptr ? type->keys : kAll) {
    out += ", " + std::string(key) + " = ";
    if (key == "out") {
      out += std::to_string(l.out);
    } else if (key == "kernel") {
      out += std::to_string(l.kernel);
    } else if (key == "stride") {
      out += std::to_string(l.stride);
    } else if (key == "pad") {
      out += std::to_string(l.pad);
    } else if (key == "bias") {
      out += l.bias ? "true" : "false";
    } else {
      out += FormatFloat(l.p);
    }
  }
  return out + " }";
}

}  // namespace

TrainConfig ParseConfig(std::string_view toml_text, const std::string& source,
                        const std::vector<std::string>& sets) {
  ConfigParser parser(source);
  parser.ParseText(toml_text);
  for (const auto& item : sets) parser.ApplySet(item);
  parser.Validate();
  return parser.Take();
}

TrainConfig LoadConfig(const std::string& path, const std::vector<std::string>& sets) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) Fail(path, "is a directory, not a config file");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    Fail(path, std::string("cannot read config file: ") + std::strerror(err) +
                   "; hint: relative paths are resolved from the current directory " +
                   std::filesystem::current_path(ec).string());
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) Fail(path, "error while reading the config file");
  return ParseConfig(text.str(), path, sets);
}

std::string ToToml(const TrainConfig& c) {
  TrainConfig copy = c;  // the schema's accessors take a mutable config; we only read
  std::string out = "# dptrain resolved configuration\n";
  std::string_view section;
  for (const Field& f : Schema()) {
    const size_t dot = f.key.find('.');
    const std::string_view sec = dot == std::string_view::npos ? "" : f.key.substr(0, dot);
    const std::string_view leaf = Leaf(f.key);
    if (sec != section) {
      out += "\n[" + std::string(sec) + "]\n";
      section = sec;
    }
    // Exactly one of model.name / model.layers is in use; write that one.
    if (f.key == "model.name" && c.model.name.empty() && !c.model.layers.empty()) continue;
    if (std::holds_alternative<LayersRef>(f.ref)) {
      if (c.model.layers.empty()) continue;
      out += std::string(leaf) + " = [\n";
      for (const LayerSpec& l : c.model.layers) out += "  " + FormatLayer(l) + ",\n";
      out += "]\n";
      continue;
    }
    out += std::string(leaf) + " = " + FormatValue(f.ref, copy) + "\n";
  }
  return out;
}

uint64_t ConfigHash(const TrainConfig& c) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64 offset basis
  for (const char ch : ToToml(c)) {
    h ^= static_cast<unsigned char>(ch);
    h *= 1099511628211ull;  // FNV-1a 64 prime
  }
  return h;
}

}  // namespace dptrain
