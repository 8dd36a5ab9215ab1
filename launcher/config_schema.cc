// SPDX-License-Identifier: Apache-2.0
// The TOML schema of TrainConfig (every dotted key and its field, the layer types) and the text
// helpers that parsing, validation and ToToml share: quoting, float formatting, "did you mean".
#include "launcher/config_schema.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <type_traits>

#include "core/error.h"

namespace dptrain::config_detail {

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
      DPT_CONFIG_FIELD(model.onnx),
      DPT_CONFIG_FIELD(model.classes),
      DPT_CONFIG_FIELD(model.channels_last),
      DPT_CONFIG_ENUM(model.loss),
      DPT_CONFIG_FIELD(model.layers),
      DPT_CONFIG_FIELD(data.train),
      DPT_CONFIG_FIELD(data.test),
      DPT_CONFIG_FIELD(data.mean),
      DPT_CONFIG_FIELD(data.std),
      DPT_CONFIG_FIELD(data.shuffle),
      DPT_CONFIG_ENUM(data.augment),
      DPT_CONFIG_FIELD(data.crop),
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
      DPT_CONFIG_FIELD(train.no_weight_decay),
      DPT_CONFIG_FIELD(train.beta1),
      DPT_CONFIG_FIELD(train.beta2),
      DPT_CONFIG_FIELD(train.eps),
      DPT_CONFIG_FIELD(train.lars_eta),
      DPT_CONFIG_ENUM(train.schedule),
      DPT_CONFIG_FIELD(train.step_size),
      DPT_CONFIG_FIELD(train.gamma),
      DPT_CONFIG_FIELD(train.milestones),
      DPT_CONFIG_FIELD(train.warmup_steps),
      DPT_CONFIG_FIELD(train.label_smoothing),
      DPT_CONFIG_FIELD(train.clip_grad_norm),
      DPT_CONFIG_ENUM(train.precision),
      DPT_CONFIG_FIELD(train.log_every_steps),
      DPT_CONFIG_FIELD(train.eval_every_epochs),
      DPT_CONFIG_FIELD(train.deterministic),
      DPT_CONFIG_FIELD(train.cudnn_benchmark),
      DPT_CONFIG_FIELD(train.winograd),
      DPT_CONFIG_FIELD(train.tf32),
      DPT_CONFIG_FIELD(train.profile),
      DPT_CONFIG_FIELD(checkpoint.every_steps),
      DPT_CONFIG_FIELD(checkpoint.every_epochs),
      DPT_CONFIG_FIELD(checkpoint.keep),
      DPT_CONFIG_FIELD(checkpoint.resume),
      DPT_CONFIG_FIELD(checkpoint.init),
      DPT_CONFIG_FIELD(memory.limit),
      DPT_CONFIG_FIELD(memory.auto_microbatch),
      DPT_CONFIG_FIELD(memory.recompute),
      DPT_CONFIG_ENUM(dist.device),
      DPT_CONFIG_ENUM(dist.backend),
      DPT_CONFIG_ENUM(dist.device_binding),
      DPT_CONFIG_FIELD(dist.gpus),
      DPT_CONFIG_FIELD(dist.bucket_mb),
      DPT_CONFIG_FIELD(dist.collective_timeout_s),
      DPT_CONFIG_FIELD(dist.threads),
      DPT_CONFIG_FIELD(dist.check_replicas_every),
      DPT_CONFIG_ENUM(dist.shard),
  };
  return fields;
}
#undef DPT_CONFIG_FIELD
#undef DPT_CONFIG_ENUM

// "an integer", ... indexed like FieldRef's alternatives.
std::string_view Expected(const FieldRef& ref) {
  static constexpr std::string_view kNames[] = {"an integer",
                                                "a number",
                                                "a boolean",
                                                "a string",
                                                "an array of numbers",
                                                "an array of layer tables",
                                                "a string",
                                                "a string or an array of strings"};
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

const std::vector<LayerType>& LayerTypes() {
  static const std::vector<LayerType> types = {
      {"conv2d",
       {"out", "kernel", "stride", "pad", "bias", "groups", "dilation"},
       {"out", "kernel"}},
      {"linear", {"out", "bias"}, {"out"}},
      {"relu", {}, {}},
      {"relu6", {}, {}},
      {"sigmoid", {}, {}},
      {"hardsigmoid", {}, {}},
      {"hardswish", {}, {}},
      {"tanh", {}, {}},
      {"maxpool", {"kernel", "stride", "pad", "ceil_mode"}, {}},
      {"avgpool", {"kernel", "stride", "pad", "ceil_mode", "count_include_pad"}, {}},
      {"batchnorm", {}, {}},
      {"dropout", {"p"}, {}},
      {"flatten", {}, {}},
      {"add", {}, {}},
      {"mul", {}, {}},
      {"concat", {}, {}},
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
  static const std::vector<std::string> keys = {
      "type",  "name", "out",    "kernel",   "stride",    "pad",
      "bias",  "p",    "groups", "dilation", "ceil_mode", "count_include_pad",
      "inputs"};
  return keys;
}

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

namespace {

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

}  // namespace

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
                       std::string_view prefix) {
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

// Every config error is raised here as "[rank r/w] WHERE: MESSAGE", WHERE being the config's own
// location ("configs/x.toml:7", "--set train.lr=abc"). DPT_THROW would add this file's line, the
// same for every error and a second, confusing location in a message about the user's file.
void Fail(const std::string& where, const std::string& msg) {
  throw ConfigError(RankTag() + where + ": " + msg);
}

// ---------------------------------------------------------------------------------------------
// Origins.

const std::string& Origins::Where(std::string_view key) const {
  const auto it = origin_.find(key);
  return it == origin_.end() ? source_ : it->second;
}

const std::string& Origins::WhereAny(std::initializer_list<std::string_view> keys) const {
  for (const auto key : keys) {
    if (origin_.count(key) > 0) return Where(key);
  }
  return source_;
}

}  // namespace dptrain::config_detail
