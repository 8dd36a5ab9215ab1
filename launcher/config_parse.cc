// SPDX-License-Identifier: Apache-2.0
// Config parsing: TOML text and --set overrides -> TrainConfig, walking the schema
// (launcher/config_schema.h), model.layers included; remembers where each value came from.
// A little over the ~400-line guide on purpose: one ConfigParser whose members read as a piece;
// splitting it would need a private header for that one class.
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <variant>

#include "core/error.h"
#include "core/util/strings.h"
#include "launcher/config.h"
#include "launcher/config_schema.h"

namespace dptrain {
namespace config_detail {
namespace {

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

// An array of strings; a single string is a list of one ("" none), so that
// `train = "data/train.h5"` and `train = ["a.h5", "b.h5"]` are both data.train.
std::vector<std::string> ReadStringList(const toml::node& n, const std::string& key,
                                        const std::string& where) {
  if (n.is_string()) {
    std::string s = ReadString(n, key, where);
    return s.empty() ? std::vector<std::string>{} : std::vector<std::string>{std::move(s)};
  }
  const auto* arr = n.as_array();
  if (arr == nullptr) {
    Fail(where, key + ": expected a string or an array of strings like [\"a\", \"b\"], got " +
                    Describe(n));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    out.push_back(ReadString((*arr)[i], key + "[" + std::to_string(i) + "]", where));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The parser: reads the file, applies overrides, validates. Remembers where each key's value came
// from so that every error can point at it.

class ConfigParser {
 public:
  explicit ConfigParser(const std::string& source)
      : origins_(source.empty() ? "<string>" : source) {
    cfg_.source = origins_.source();
  }

  void ParseText(std::string_view text);
  void ApplySet(const std::string& item);
  void Validate() { config_detail::Validate(cfg_, origins_); }
  TrainConfig Take() { return std::move(cfg_); }

 private:
  // "configs/x.toml:7" for a region (the key's own line when known), else the source alone.
  std::string At(const toml::source_region& key, const toml::source_region& value) const {
    const auto line = key.begin.line > 0 ? key.begin.line : value.begin.line;
    const std::string& source = origins_.source();
    return line > 0 ? source + ":" + std::to_string(line) : source;
  }

  void Assign(const Field& f, const toml::node& n, const std::string& where);
  std::vector<LayerSpec> ParseLayers(const toml::node& n, const std::string& where) const;
  LayerSpec ParseLayer(const toml::node& n, size_t index, const std::string& array_where) const;

  // The index of `v` among an enum key's spellings; anything else fails naming them.
  size_t Choice(const EnumRef& r, const std::string& v, const std::string& key,
                const std::string& where) const;
  size_t ReadChoice(const EnumRef& r, const toml::node& n, const std::string& key,
                    const std::string& where) const {
    return Choice(r, ReadString(n, key, where), key, where);
  }

  Origins origins_;
  TrainConfig cfg_;
};

void ConfigParser::ParseText(std::string_view text) {
  toml::table root;
  try {
    root = toml::parse(text, origins_.source());
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    std::string msg = "TOML syntax error: " + std::string(e.description());
    if (e.description().find("could not determine value type") != std::string_view::npos) {
      msg += "; hint: strings are quoted in the file (train = \"data/train.h5\")";
    }
    Fail(origins_.source() + ":" + std::to_string(b.line) + ":" + std::to_string(b.column), msg);
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
                 [&](StringListRef r) { r(cfg_) = ReadStringList(n, key, where); },
             },
             f.ref);
  origins_.Set(key, where);
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

  // A string list given as one plain string (--set data.train=/d/x.h5, or "" for none): the
  // list of that one string, taken as written like a string key.
  const bool one_of_list =
      std::holds_alternative<StringListRef>(f->ref) && !value.empty() && value.front() != '[';
  if (std::holds_alternative<StringRef>(f->ref) || std::holds_alternative<EnumRef>(f->ref) ||
      one_of_list || (std::holds_alternative<StringListRef>(f->ref) && value.empty())) {
    // Strings are taken as written; quotes are optional.
    std::string s = value;
    if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) {
      s = s.substr(1, s.size() - 2);
    }
    if (!IsValidUtf8(s)) Fail(where, key + ": the value is not valid UTF-8 text");
    if (const auto* e = std::get_if<EnumRef>(&f->ref)) {
      e->set(cfg_, Choice(*e, s, key, where));
    } else if (const auto* l = std::get_if<StringListRef>(&f->ref)) {
      (*l)(cfg_) = s.empty() ? std::vector<std::string>{} : std::vector<std::string>{s};
    } else {
      std::get<StringRef>(f->ref)(cfg_) = s;
    }
    origins_.Set(key, where);
    // Choosing a model on the command line replaces the one from the file.
    if (key == "model.name" && !s.empty()) {
      cfg_.model.layers.clear();
      cfg_.model.onnx.clear();
    }
    if (key == "model.onnx" && !s.empty()) {
      cfg_.model.layers.clear();
      cfg_.model.name.clear();
    }
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
    const std::string base = "model.layers[" + std::to_string(i) + "]";
    for (const std::string& in : layers.back().inputs) {
      if (index_of_name.count(in) == 0) {
        Fail(At({}, el.source()),
             base + ".inputs: \"" + in + "\" is not the name of an earlier layer" +
                 (in == layers.back().name ? " (a layer cannot read its own output)" : "") +
                 "; inputs name layers listed before this one");
      }
    }
    const auto [it, inserted] = index_of_name.emplace(layers.back().name, i);
    if (!inserted) {
      Fail(At({}, el.source()), base + ".name \"" + layers.back().name +
                                    "\" is already used by model.layers[" +
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
    } else if (key == "groups") {
      l.groups = ReadInt(v, full, w);
    } else if (key == "dilation") {
      l.dilation = ReadInt(v, full, w);
    } else if (key == "ceil_mode") {
      l.ceil_mode = ReadBool(v, full, w);
    } else if (key == "count_include_pad") {
      l.count_include_pad = ReadBool(v, full, w);
    } else if (key == "inputs") {
      l.inputs = ReadStringList(v, full, w);
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
    if (key == "type" || key == "name" || key == "inputs") continue;
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
  // Upper bounds far beyond any real layer, so that no size wraps around in the shape arithmetic
  // or the libraries' descriptors (kMaxLayerWindow, kMaxLayerWidth: models/model_spec.h).
  const auto in_range = [&](const std::string& key, int64_t v, int64_t min, int64_t max) {
    if (v < min || v > max) {
      Fail(at(key), base + "." + key + " must be " + (v < min ? ">= " : "<= ") +
                        std::to_string(v < min ? min : max) + ", got " + std::to_string(v));
    }
  };
  if (applies("out")) in_range("out", l.out, 1, kMaxLayerWidth);
  if (applies("kernel")) in_range("kernel", l.kernel, 1, kMaxLayerWindow);
  if (applies("stride")) in_range("stride", l.stride, 1, kMaxLayerWindow);
  if (applies("pad")) in_range("pad", l.pad, 0, kMaxLayerWindow);
  if (applies("groups")) in_range("groups", l.groups, 1, kMaxLayerWidth);
  if (applies("dilation")) in_range("dilation", l.dilation, 1, kMaxLayerWindow);
  if (applies("groups") && l.out % l.groups != 0) {
    Fail(at("groups"), base + ".groups (" + std::to_string(l.groups) + ") must divide out (" +
                           std::to_string(l.out) + ")");
  }
  if (pool && 2 * l.pad > l.kernel) {
    Fail(at("pad"), base + ".pad must be <= kernel / 2 (" + std::to_string(l.kernel / 2) +
                        "), got " + std::to_string(l.pad));
  }
  const bool joins = l.type == "add" || l.type == "mul" || l.type == "concat";
  if (joins && l.inputs.size() < 2) {
    Fail(at("inputs"), base + ": a " + l.type +
                           " layer joins several layers: give inputs = [\"a\", \"b\", ...] "
                           "(at least two names of earlier layers)");
  }
  if (!joins && l.inputs.size() > 1) {
    Fail(at("inputs"), base + ".inputs: a " + l.type +
                           " layer reads one layer's output; only add, mul and concat take "
                           "several");
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

}  // namespace
}  // namespace config_detail

TrainConfig ParseConfig(std::string_view toml_text, const std::string& source,
                        const std::vector<std::string>& sets) {
  config_detail::ConfigParser parser(source);
  parser.ParseText(toml_text);
  for (const auto& item : sets) parser.ApplySet(item);
  parser.Validate();
  return parser.Take();
}

TrainConfig LoadConfig(const std::string& path, const std::vector<std::string>& sets) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    config_detail::Fail(path, "is a directory, not a config file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    config_detail::Fail(path,
                        std::string("cannot read config file: ") + std::strerror(err) +
                            "; hint: relative paths are resolved from the current directory " +
                            std::filesystem::current_path(ec).string());
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) config_detail::Fail(path, "error while reading the config file");
  return ParseConfig(text.str(), path, sets);
}

}  // namespace dptrain
