// SPDX-License-Identifier: Apache-2.0
// TrainConfig -> TOML (every key, fixed order, floats that read back exactly) and the hash of
// that text the ranks compare.
#include <string>
#include <variant>

#include "launcher/config.h"
#include "launcher/config_schema.h"

namespace dptrain {
namespace config_detail {
namespace {

std::string FormatValue(const FieldRef& ref, TrainConfig& c) {
  return std::visit(Overloaded{
                        [&](IntRef r) { return std::to_string(r(c)); },
                        [&](FloatRef r) { return FormatFloat(r(c)); },
                        [&](BoolRef r) { return std::string(r(c) ? "true" : "false"); },
                        [&](StringRef r) { return Quote(r(c)); },
                        [&](FloatListRef r) { return FormatFloatList(r(c)); },
                        [&](LayersRef) { return std::string(); },  // written by FormatLayer
                        [&](const EnumRef& r) { return Quote(r.names[r.get(c)]); },
                        [&](StringListRef r) {
                          std::string out = "[";
                          for (const std::string& s : r(c)) {
                            out += (out.size() > 1 ? ", " : "") + Quote(s);
                          }
                          return out + "]";
                        },
                    },
                    ref);
}

// One layer as an inline table: type, name, then the keys its type takes.
std::string FormatLayer(const LayerSpec& l) {
  std::string out = "{ type = " + Quote(l.type) + ", name = " + Quote(l.name);
  static const std::vector<std::string_view> kAll = {
      "out", "kernel", "stride",   "pad",       "bias",
      "p",   "groups", "dilation", "ceil_mode", "count_include_pad"};
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
    } else if (key == "groups") {
      out += std::to_string(l.groups);
    } else if (key == "dilation") {
      out += std::to_string(l.dilation);
    } else if (key == "ceil_mode") {
      out += l.ceil_mode ? "true" : "false";
    } else if (key == "count_include_pad") {
      out += l.count_include_pad ? "true" : "false";
    } else {
      out += FormatFloat(l.p);
    }
  }
  if (!l.inputs.empty()) {
    out += ", inputs = [";
    for (size_t i = 0; i < l.inputs.size(); ++i) out += (i > 0 ? ", " : "") + Quote(l.inputs[i]);
    out += "]";
  }
  return out + " }";
}

}  // namespace
}  // namespace config_detail

std::string ToToml(const TrainConfig& c) {
  TrainConfig copy = c;  // the schema's accessors take a mutable config; we only read
  std::string out = "# dptrain resolved configuration\n";
  std::string_view section;
  for (const config_detail::Field& f : config_detail::Schema()) {
    const size_t dot = f.key.find('.');
    const std::string_view sec = dot == std::string_view::npos ? "" : f.key.substr(0, dot);
    const std::string_view leaf = config_detail::Leaf(f.key);
    if (sec != section) {
      out += "\n[" + std::string(sec) + "]\n";
      section = sec;
    }
    // Exactly one of model.name / model.layers is in use; write that one.
    if (f.key == "model.name" && c.model.name.empty() &&
        (!c.model.layers.empty() || !c.model.onnx.empty())) {
      continue;
    }
    if (f.key == "model.onnx" && c.model.onnx.empty()) continue;
    if (std::holds_alternative<config_detail::LayersRef>(f.ref)) {
      if (c.model.layers.empty()) continue;
      out += std::string(leaf) + " = [\n";
      for (const LayerSpec& l : c.model.layers) out += "  " + config_detail::FormatLayer(l) + ",\n";
      out += "]\n";
      continue;
    }
    out += std::string(leaf) + " = " + config_detail::FormatValue(f.ref, copy) + "\n";
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
