// SPDX-License-Identifier: Apache-2.0
// ONNX import: parse and check with libonnx, then map node by node onto dptrain layers. The
// translation keeps PyTorch's names: a layer is named after its weight's prefix, a node after
// the ONNX node, so errors and memory reports point at what the user wrote.
#include "models/onnx/onnx_import.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/util/input_file.h"
#include "models/layers/activation.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/dropout.h"
#include "models/layers/flatten.h"
#include "models/layers/join.h"
#include "models/layers/linear.h"
#include "models/layers/pad.h"
#include "models/layers/pool.h"
#include "models/layers/relu.h"
#include "models/model.h"
#include "models/model_spec.h"

namespace dptrain {
namespace {

constexpr char kSupported[] =
    "Conv (groups, dilations, asymmetric pads), Gemm, MatMul (x @ W^T), Relu, Clip, Sigmoid, "
    "HardSigmoid, HardSwish, Tanh, MaxPool and AveragePool (ceil_mode, count_include_pad), "
    "GlobalAveragePool, BatchNormalization, Add and Mul (equal shapes or [N, C, 1, 1]), Concat, "
    "Flatten, Reshape (to a constant shape keeping the batch), Pad (zero), Dropout, Identity, "
    "Constant, and shape arithmetic on constants";
constexpr char kExport[] =
    "torch.onnx.export(model, x, FILE, training=torch.onnx.TrainingMode.TRAINING, "
    "do_constant_folding=False) (with PyTorch 2.9 or later also dynamo=False)";

onnx::ModelProto LoadModel(const std::string& path) {
  // Protocol buffers parse at most 2 GiB (larger models keep their weights outside the file,
  // ONNX external data, which the importer refuses).
  std::vector<uint8_t> bytes;
  if (const std::string why = ReadInputFile(path, "an ONNX model", &bytes, INT_MAX); !why.empty()) {
    DPT_THROW(ConfigError) << "model.onnx: " << path << ": " << why;
  }
  onnx::ModelProto m;
  DPT_CHECK_AS(ConfigError, m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) &&
                                m.has_graph() && m.ir_version() > 0)
      << "model.onnx: " << path << " is not an ONNX model (truncated, or another format); write "
      << "it with " << kExport;
  try {
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    DPT_THROW(ConfigError) << "model.onnx: " << path << " is not a valid ONNX model: " << e.what();
  }
  int64_t opset = 0;
  for (const auto& o : m.opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  }
  DPT_CHECK_AS(ConfigError, opset >= 13 && opset <= 17)
      << "model.onnx: " << path << " uses opset " << opset
      << "; dptrain reads opsets 13 to 17 (torch.onnx.export(..., opset_version=13), with "
      << "PyTorch 2.9 or later also dynamo=False)";
  return m;
}

std::string NodeName(const onnx::NodeProto& n, size_t index) {
  return n.name().empty() ? n.op_type() + "_" + std::to_string(index) : n.name();
}

// A float tensor's values (raw little-endian bytes or float_data). Empty optional on other
// types is the caller's error to raise.
bool ReadFloats(const onnx::TensorProto& t, std::vector<float>* out) {
  if (t.data_type() == onnx::TensorProto::FLOAT) {
    if (t.has_raw_data()) {
      out->resize(t.raw_data().size() / sizeof(float));
      std::memcpy(out->data(), t.raw_data().data(), out->size() * sizeof(float));
    } else {
      out->assign(t.float_data().begin(), t.float_data().end());
    }
    return true;
  }
  if (t.data_type() == onnx::TensorProto::DOUBLE) {
    std::vector<double> d;
    if (t.has_raw_data()) {
      d.resize(t.raw_data().size() / sizeof(double));
      std::memcpy(d.data(), t.raw_data().data(), d.size() * sizeof(double));
    } else {
      d.assign(t.double_data().begin(), t.double_data().end());
    }
    out->assign(d.begin(), d.end());
    return true;
  }
  return false;
}

// An int64 tensor's values (raw little-endian bytes or int64_data); false on other types.
bool ReadInts(const onnx::TensorProto& t, std::vector<int64_t>* out) {
  if (t.data_type() != onnx::TensorProto::INT64) return false;
  if (t.has_raw_data()) {
    out->resize(t.raw_data().size() / sizeof(int64_t));
    std::memcpy(out->data(), t.raw_data().data(), out->size() * sizeof(int64_t));
  } else {
    out->assign(t.int64_data().begin(), t.int64_data().end());
  }
  return true;
}

int64_t Numel(const onnx::TensorProto& t) {
  int64_t n = 1;
  for (int64_t d : t.dims()) n *= d;
  return n;
}

// A float attribute stored in float32 (ONNX's momentum 0.9 is 0.8999999762): back to the
// decimal the user wrote, to float precision.
double Decimal(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.7g", v);
  return std::strtod(buf, nullptr);
}

// A small int64 tensor computed at load time from constants alone: the shape arithmetic
// torch.onnx writes around F.pad (Shape, Gather, Sub, ConstantOfShape, Concat, Reshape, Slice,
// Transpose, Cast of constant lists). Such nodes are folded, never run.
struct IntTensor {
  std::vector<int64_t> dims;
  std::vector<int64_t> v;
};

int64_t Count(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// Row-major strides of dims.
std::vector<int64_t> Strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> st(dims.size(), 1);
  for (size_t a = dims.size(); a-- > 1;) st[a - 1] = st[a] * dims[a];
  return st;
}

// out[i] = in[sum_a index[a][i_a] * stride_a]: the tensor of the elements `index` picks on
// every axis (Slice, Gather on one axis, Transpose via `axes`).
IntTensor Pick(const IntTensor& in, const std::vector<std::vector<int64_t>>& index,
               const std::vector<size_t>& axes) {
  IntTensor out;
  const std::vector<int64_t> st = Strides(in.dims);
  for (size_t a : axes) out.dims.push_back(static_cast<int64_t>(index[a].size()));
  const int64_t n = Count(out.dims);
  std::vector<int64_t> at(axes.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t src = 0;
    for (size_t k = 0; k < axes.size(); ++k) src += index[axes[k]][at[k]] * st[axes[k]];
    out.v.push_back(in.v[src]);
    for (size_t k = axes.size(); k-- > 0;) {
      if (++at[k] < out.dims[k]) break;
      at[k] = 0;
    }
  }
  return out;
}

class Importer {
 public:
  Importer(Backend& be, std::string path) : be_(be), path_(std::move(path)) {}

  // Fills `problems` (node index -> why not) instead of throwing when given: for inspect.
  OnnxModel Run(const onnx::ModelProto& m, std::map<size_t, std::string>* problems = nullptr);

 private:
  const onnx::NodeProto* node_ = nullptr;  // the node being translated, for errors
  std::string node_name_;
  mutable std::string problem_;  // the last Fail's reason, for inspect

  [[noreturn]] void Fail(const std::string& what) const {
    problem_ = what;
    DPT_THROW(ConfigError) << "model.onnx: " << path_ << ": node '" << node_name_ << "' ("
                           << node_->op_type() << "): " << what;
  }
  const onnx::AttributeProto* Attr(const char* name) const {
    for (const auto& a : node_->attribute()) {
      if (a.name() == name) return &a;
    }
    return nullptr;
  }
  int64_t Int(const char* name, int64_t def) const {
    const auto* a = Attr(name);
    return a == nullptr ? def : a->i();
  }
  double Float(const char* name, double def) const {
    const auto* a = Attr(name);
    return a == nullptr ? def : a->f();
  }
  std::vector<int64_t> Ints(const char* name, std::vector<int64_t> def) const {
    const auto* a = Attr(name);
    if (a == nullptr) return def;
    return {a->ints().begin(), a->ints().end()};
  }
  // Refuses every attribute of the node but `known`, so nothing is silently ignored.
  void OnlyAttributes(std::initializer_list<const char*> known) const {
    for (const auto& a : node_->attribute()) {
      bool ok = false;
      for (const char* k : known) ok = ok || a.name() == k;
      if (!ok) Fail("attribute '" + a.name() + "' is not supported");
    }
  }
  void NoAutoPad() const {
    const auto* a = Attr("auto_pad");
    if (a != nullptr && a->s() != "NOTSET") Fail("auto_pad=" + a->s() + " is not supported");
  }
  // Square 2-D window: kernel, stride, symmetric pad, and equal dilations (refused unless
  // `dilation` is given). Pads that differ between sides are refused unless `sides` is given:
  // then it gets them (top, left, bottom, right) and *pad is 0.
  void Window(int64_t* kernel, int64_t* stride, int64_t* pad, int64_t* dilation = nullptr,
              std::vector<int64_t>* sides = nullptr) const;
  // The value of optional input k when it is a constant scalar (a Constant node's output or an
  // initializer); `def` when the input is absent; Fail naming `what` otherwise.
  double ConstScalar(int k, const char* what, double def) const;
  // The tensor a Constant node or an initializer named `name` holds; nullptr for anything else.
  const onnx::TensorProto* ConstantValue(const std::string& name) const {
    const auto c = const_.find(name);
    if (c != const_.end()) return c->second;
    const auto it = init_.find(name);
    return it != init_.end() ? it->second : nullptr;
  }

  // The int64 value `name` holds when it is a constant, an int64 initializer or a folded node.
  bool ConstInts(const std::string& name, IntTensor* out) const;
  // Folds the node when it is shape arithmetic over constants only; false otherwise.
  bool Fold();

  // The graph node that computes value `name` (kInput for the graph input).
  int Source(const std::string& name) const {
    const auto it = value_.find(name);
    if (it == value_.end()) {
      if (init_.count(name) != 0 || transposed_.count(name) != 0)
        Fail("input '" + name +
             "' is an initializer; dptrain runs "
             "this op on computed tensors only");
      if (const_.count(name) != 0 || folded_.count(name) != 0)
        Fail("input '" + name + "' is a constant; dptrain runs this op on computed tensors only");
      Fail("input '" + name + "' is not computed by an earlier node");
    }
    return it->second;
  }
  // The initializer `name` (input `k` of the node), which must be named `<prefix>.<suffix>`
  // (the PyTorch parameter name); sets prefix when empty. Stores its values as the parameter's
  // starting value.
  const onnx::TensorProto& Param(int k, const char* suffix, std::string* prefix);
  const onnx::TensorProto& Param(const std::string& name, const char* suffix, std::string* prefix);

  Backend& be_;
  std::string path_;
  std::unique_ptr<Graph> graph_;
  std::map<std::string, const onnx::TensorProto*> init_;
  std::map<std::string, const onnx::TensorProto*> const_;  // Constant node outputs
  std::map<std::string, IntTensor> folded_;                // shape arithmetic done at load
  std::map<std::string, std::string> transposed_;          // Transpose output -> initializer
  std::map<std::string, int> value_;                       // value name -> graph node
  std::set<std::string> read_;                             // values some node or output reads
};

void Importer::Window(int64_t* kernel, int64_t* stride, int64_t* pad, int64_t* dilation,
                      std::vector<int64_t>* sides) const {
  NoAutoPad();
  // Each value in [lo, kMaxLayerWindow] (model_spec.h): a stride of 0 would divide by zero.
  const auto check = [&](const char* attr, const std::vector<int64_t>& v, int64_t lo) {
    for (int64_t x : v) {
      if (x < lo || x > kMaxLayerWindow) {
        Fail(std::string(attr) + " " + std::to_string(x) + " is outside [" + std::to_string(lo) +
             ", " + std::to_string(kMaxLayerWindow) + "]");
      }
    }
  };
  const auto k = Ints("kernel_shape", {});
  if (k.size() != 2 || k[0] != k[1]) Fail("only square 2-D kernels are supported");
  check("kernel_shape", k, 1);
  const auto s = Ints("strides", {1, 1});
  if (s.size() != 2 || s[0] != s[1]) Fail("only equal strides are supported");
  check("strides", s, 1);
  const auto p = Ints("pads", {0, 0, 0, 0});
  if (p.size() != 4) Fail("pads must have 4 values (2-D)");
  for (int64_t v : p) {
    if (v < 0) Fail("negative pads are not supported");
  }
  check("pads", p, 0);
  if (p[0] != p[1] || p[0] != p[2] || p[0] != p[3]) {
    if (sides == nullptr) Fail("only equal pads on every side are supported");
    *sides = {p[0], p[1], p[2], p[3]};  // ONNX: begins (top, left), then ends (bottom, right)
  }
  const auto d = Ints("dilations", {1, 1});
  if (d.size() != 2 || d[0] != d[1]) Fail("only equal dilations are supported");
  check("dilations", d, 1);
  if (dilation == nullptr && d[0] != 1) Fail("dilations other than 1 are not supported");
  if (dilation != nullptr) *dilation = d[0];
  *kernel = k[0];
  *stride = s[0];
  *pad = sides != nullptr && !sides->empty() ? 0 : p[0];
}

double Importer::ConstScalar(int k, const char* what, double def) const {
  if (node_->input_size() <= k || node_->input(k).empty()) return def;
  const onnx::TensorProto* t = ConstantValue(node_->input(k));
  std::vector<float> v;
  if (t == nullptr || !ReadFloats(*t, &v) || v.size() != 1) {
    Fail(std::string("the ") + what + " must be a constant scalar");
  }
  return v[0];
}

const onnx::TensorProto& Importer::Param(int k, const char* suffix, std::string* prefix) {
  if (node_->input_size() <= k || node_->input(k).empty()) {
    Fail(std::string("the ") + suffix + " input is missing");
  }
  return Param(node_->input(k), suffix, prefix);
}

const onnx::TensorProto& Importer::Param(const std::string& name, const char* suffix,
                                         std::string* prefix) {
  const auto it = init_.find(name);
  if (it == init_.end()) {
    Fail("input '" + name + "' (the " + suffix +
         ") is not an initializer; dptrain trains "
         "weights stored in the file (export with do_constant_folding=False)");
  }
  const std::string dot_suffix = std::string(".") + suffix;
  if (name.size() <= dot_suffix.size() ||
      name.compare(name.size() - dot_suffix.size(), dot_suffix.size(), dot_suffix) != 0) {
    Fail("initializer '" + name + "' is not named <module>" + dot_suffix +
         " as PyTorch names parameters");
  }
  const std::string p = name.substr(0, name.size() - dot_suffix.size());
  if (prefix->empty()) {
    *prefix = p;
  } else if (p != *prefix) {
    Fail("initializer '" + name + "' does not belong to module '" + *prefix + "'");
  }
  std::vector<float> v;
  if (!ReadFloats(*it->second, &v)) Fail("initializer '" + name + "' is not a float tensor");
  if (it->second->data_location() == onnx::TensorProto::EXTERNAL) {
    Fail("initializer '" + name + "' is stored outside the file; export without external data");
  }
  if (static_cast<int64_t>(v.size()) != Numel(*it->second)) {
    Fail("initializer '" + name + "' holds " + std::to_string(v.size()) + " values for " +
         std::to_string(Numel(*it->second)));
  }
  // A NaN or Inf weight would surface as a NaN loss blamed on the learning rate.
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      const char* what = std::isnan(v[i]) ? "NaN" : v[i] > 0 ? "Inf" : "-Inf";
      Fail("initializer '" + name + "' holds " + what + " at index " + std::to_string(i) +
           "; the exported weights are not finite");
    }
  }
  graph_->SetInitialValue(name, std::move(v));
  return *it->second;
}

bool Importer::ConstInts(const std::string& name, IntTensor* out) const {
  const auto f = folded_.find(name);
  if (f != folded_.end()) {
    *out = f->second;
    return true;
  }
  const onnx::TensorProto* t = ConstantValue(name);
  if (t == nullptr || !ReadInts(*t, &out->v)) return false;
  out->dims.assign(t->dims().begin(), t->dims().end());
  return static_cast<int64_t>(out->v.size()) == Count(out->dims);
}

bool Importer::Fold() {
  const onnx::NodeProto& n = *node_;
  static const std::set<std::string> kFoldable = {
      "Shape",     "Size",    "Gather",    "Add",     "Sub",
      "Mul",       "Div",     "Cast",      "Reshape", "Concat",
      "Unsqueeze", "Squeeze", "Transpose", "Slice",   "ConstantOfShape"};
  if (kFoldable.count(n.op_type()) == 0 || n.input_size() == 0) return false;
  std::vector<IntTensor> in(static_cast<size_t>(n.input_size()));
  std::vector<bool> given(in.size(), false);
  for (int k = 0; k < n.input_size(); ++k) {
    if (n.input(k).empty()) continue;
    // Shape and Size read only the dims: a float constant will do.
    const onnx::TensorProto* t = ConstantValue(n.input(k));
    if ((n.op_type() == "Shape" || n.op_type() == "Size") && t != nullptr) {
      in[k].dims.assign(t->dims().begin(), t->dims().end());
    } else if (!ConstInts(n.input(k), &in[k])) {
      return false;
    }
    given[k] = true;
  }
  const std::string& op = n.op_type();
  const auto scalar = [](int64_t v) { return IntTensor{{}, {v}}; };
  const auto axis_of = [&](int64_t a, size_t rank) {
    if (a < 0) a += static_cast<int64_t>(rank);
    if (a < 0 || a >= static_cast<int64_t>(rank)) Fail("axis out of range");
    return static_cast<size_t>(a);
  };
  const auto all = [](int64_t d) {
    std::vector<int64_t> i(static_cast<size_t>(d));
    for (int64_t k = 0; k < d; ++k) i[static_cast<size_t>(k)] = k;
    return i;
  };
  // Every index of every axis: Pick's `index` for the whole tensor.
  const auto every_index = [&](const std::vector<int64_t>& dims) {
    std::vector<std::vector<int64_t>> index(dims.size());
    for (size_t a = 0; a < dims.size(); ++a) index[a] = all(dims[a]);
    return index;
  };
  const auto every_axis = [](size_t rank) {
    std::vector<size_t> a(rank);
    for (size_t k = 0; k < rank; ++k) a[k] = k;
    return a;
  };
  IntTensor r;
  if (op == "Shape") {
    r = IntTensor{{static_cast<int64_t>(in[0].dims.size())}, in[0].dims};
  } else if (op == "Size") {
    r = scalar(Count(in[0].dims));
  } else if (op == "Cast") {
    if (Int("to", 0) != onnx::TensorProto::INT64) return false;
    r = in[0];
  } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    const IntTensor& a = in[0];
    const IntTensor& b = in[1];
    if (a.v.size() != b.v.size() && a.v.size() != 1 && b.v.size() != 1) return false;
    r = a.v.size() >= b.v.size() ? a : b;
    for (size_t i = 0; i < r.v.size(); ++i) {
      const int64_t x = a.v[a.v.size() == 1 ? 0 : i], y = b.v[b.v.size() == 1 ? 0 : i];
      if (op == "Div" && y == 0) Fail("division by zero in constant shape arithmetic");
      r.v[i] = op == "Add" ? x + y : op == "Sub" ? x - y : op == "Mul" ? x * y : x / y;
    }
  } else if (op == "ConstantOfShape") {
    const auto* v = Attr("value");
    std::vector<int64_t> fill{0};
    if (v == nullptr || !ReadInts(v->t(), &fill) || fill.size() != 1) return false;
    r.dims = in[0].v;
    r.v.assign(static_cast<size_t>(Count(r.dims)), fill[0]);
  } else if (op == "Reshape") {
    r.v = in[0].v;
    int64_t known = 1, infer = -1;
    for (size_t a = 0; a < in[1].v.size(); ++a) {
      int64_t d = in[1].v[a];
      if (d == 0 && a < in[0].dims.size()) d = in[0].dims[a];
      if (d == -1) infer = static_cast<int64_t>(a);
      r.dims.push_back(d);
      if (d != -1) known *= d;
    }
    if (infer >= 0 && known > 0) r.dims[static_cast<size_t>(infer)] = Count(in[0].dims) / known;
    if (Count(r.dims) != Count(in[0].dims)) Fail("Reshape of a constant to a different size");
  } else if (op == "Concat") {
    const size_t rank = in[0].dims.size();
    const size_t axis = axis_of(Int("axis", 0), rank);
    r.dims = in[0].dims;
    r.dims[axis] = 0;
    for (const IntTensor& t : in) r.dims[axis] += t.dims.size() == rank ? t.dims[axis] : 0;
    const int64_t outer = Count(std::vector<int64_t>(r.dims.begin(), r.dims.begin() + axis));
    for (int64_t o = 0; o < outer; ++o) {
      for (const IntTensor& t : in) {
        if (t.dims.size() != rank) Fail("Concat of constants of different ranks");
        const int64_t chunk = Count(std::vector<int64_t>(t.dims.begin() + axis, t.dims.end()));
        r.v.insert(r.v.end(), t.v.begin() + o * chunk, t.v.begin() + (o + 1) * chunk);
      }
    }
  } else if (op == "Unsqueeze" || op == "Squeeze") {
    r = in[0];
    std::vector<int64_t> axes = given.size() > 1 && given[1] ? in[1].v : std::vector<int64_t>{};
    if (op == "Unsqueeze") {
      const size_t rank = r.dims.size() + axes.size();
      std::vector<size_t> at(axes.size());
      for (size_t k = 0; k < axes.size(); ++k) at[k] = axis_of(axes[k], rank);
      std::sort(at.begin(), at.end());
      for (size_t a : at) r.dims.insert(r.dims.begin() + static_cast<int64_t>(a), 1);
    } else {
      std::vector<int64_t> dims;
      for (size_t a = 0; a < r.dims.size(); ++a) {
        bool drop = axes.empty() && r.dims[a] == 1;
        for (int64_t x : axes) drop = drop || axis_of(x, r.dims.size()) == a;
        if (!drop) dims.push_back(r.dims[a]);
      }
      r.dims = dims;
    }
  } else if (op == "Transpose") {
    const size_t rank = in[0].dims.size();
    std::vector<int64_t> perm = Ints("perm", {});
    if (perm.empty()) {
      for (size_t a = rank; a-- > 0;) perm.push_back(static_cast<int64_t>(a));
    }
    std::vector<std::vector<int64_t>> index = every_index(in[0].dims);
    std::vector<size_t> axes(perm.size());
    for (size_t k = 0; k < perm.size(); ++k) axes[k] = axis_of(perm[k], rank);
    r = Pick(in[0], index, axes);
  } else if (op == "Gather") {
    const size_t rank = in[0].dims.size();
    const size_t axis = axis_of(Int("axis", 0), rank);
    if (in[1].dims.size() > 1) return false;
    std::vector<std::vector<int64_t>> index = every_index(in[0].dims);
    index[axis].clear();
    for (int64_t i : in[1].v) {
      if (i < -in[0].dims[axis] || i >= in[0].dims[axis]) Fail("Gather index out of range");
      index[axis].push_back(i < 0 ? i + in[0].dims[axis] : i);
    }
    r = Pick(in[0], index, every_axis(rank));
    if (in[1].dims.empty()) r.dims.erase(r.dims.begin() + static_cast<int64_t>(axis));
  } else if (op == "Slice") {
    const size_t rank = in[0].dims.size();
    const std::vector<int64_t>& starts = in[1].v;
    const std::vector<int64_t>& ends = in[2].v;
    std::vector<int64_t> axes = given.size() > 3 && given[3] ? in[3].v : std::vector<int64_t>{};
    const std::vector<int64_t> steps =
        given.size() > 4 && given[4] ? in[4].v : std::vector<int64_t>(starts.size(), 1);
    if (axes.empty()) {
      for (size_t a = 0; a < starts.size(); ++a) axes.push_back(static_cast<int64_t>(a));
    }
    if (ends.size() != starts.size() || axes.size() != starts.size() ||
        steps.size() != starts.size()) {
      Fail("Slice of a constant with starts, ends, axes and steps of different lengths");
    }
    std::vector<std::vector<int64_t>> index = every_index(in[0].dims);
    for (size_t k = 0; k < starts.size(); ++k) {
      const size_t a = axis_of(axes[k], rank);
      const int64_t d = in[0].dims[a], step = steps[k];
      if (step == 0) Fail("Slice with step 0");
      // ONNX's clamping: negative indices count from the end; starts clamp to [0, d] (to
      // [0, d - 1] stepping backwards), ends to [-1, d].
      const auto clamp = [](int64_t v, int64_t lo, int64_t hi) {
        return v < lo ? lo : (v > hi ? hi : v);
      };
      int64_t b = starts[k] < 0 ? starts[k] + d : starts[k];
      int64_t e = ends[k] < 0 ? ends[k] + d : ends[k];
      b = step > 0 ? clamp(b, 0, d) : clamp(b, 0, d - 1);
      e = step > 0 ? clamp(e, 0, d) : clamp(e, -1, d - 1);
      index[a].clear();
      for (int64_t i = b; step > 0 ? i < e : i > e; i += step) index[a].push_back(i);
    }
    r = Pick(in[0], index, every_axis(rank));
  }
  folded_[n.output(0)] = std::move(r);
  return true;
}

OnnxModel Importer::Run(const onnx::ModelProto& m, std::map<size_t, std::string>* problems) {
  const onnx::GraphProto& g = m.graph();
  graph_ = std::make_unique<Graph>(be_);
  graph_->set_origin(path_);
  for (const auto& t : g.initializer()) init_[t.name()] = &t;
  for (const auto& n : g.node()) {
    for (const auto& in : n.input()) read_.insert(in);
  }
  for (const auto& o : g.output()) read_.insert(o.name());

  OnnxModel out;
  std::vector<std::string> inputs;
  for (const auto& in : g.input()) {
    if (init_.count(in.name()) == 0) inputs.push_back(in.name());
  }
  const auto list = [](const auto& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  DPT_CHECK_AS(ConfigError, inputs.size() == 1)
      << "model.onnx: " << path_ << " has " << inputs.size() << " inputs (" << list(inputs)
      << "); dptrain feeds one, the batch of samples";
  std::vector<std::string> outputs;
  for (const auto& o : g.output()) outputs.push_back(o.name());
  DPT_CHECK_AS(ConfigError, outputs.size() == 1)
      << "model.onnx: " << path_ << " has " << outputs.size() << " outputs (" << list(outputs)
      << "); dptrain trains one, the logits";
  for (const auto& in : g.input()) {
    if (in.name() != inputs[0]) continue;
    const auto& dims = in.type().tensor_type().shape().dim();
    for (int d = 1; d < dims.size(); ++d) {
      out.sample_dims.push_back(dims[d].has_dim_value() ? dims[d].dim_value() : 0);
    }
  }
  value_[inputs[0]] = Graph::kInput;

  for (int i = 0; i < g.node_size(); ++i) {
    node_ = &g.node(i);
    node_name_ = NodeName(*node_, static_cast<size_t>(i));
    try {
      const onnx::NodeProto& n = *node_;
      const std::string& op = n.op_type();
      if (!n.domain().empty() && n.domain() != "ai.onnx") Fail("domain " + n.domain());
      // Outputs after the first (batch norm's statistics, dropout's mask) must be unread.
      for (int k = 1; k < n.output_size(); ++k) {
        if (!n.output(k).empty() && read_.count(n.output(k)) != 0) {
          Fail("output " + std::to_string(k) + " ('" + n.output(k) + "') is read; dptrain " +
               "computes only the first output of " + op);
        }
      }
      std::unique_ptr<Layer> layer;
      std::vector<int> from;
      if (op == "Constant") {
        const auto* v = Attr("value");
        if (v == nullptr) Fail("only Constant with a tensor 'value' is supported");
        const_[n.output(0)] = &v->t();
        continue;
      }
      if (Fold()) continue;
      if (op == "Identity") {
        value_[n.output(0)] = Source(n.input(0));
        continue;
      }
      if (op == "Transpose" && n.input_size() == 1 && init_.count(n.input(0)) != 0) {
        // nn.Linear without bias exports x @ W^T as MatMul(x, Transpose(W)).
        OnlyAttributes({"perm"});
        if (Ints("perm", {1, 0}) != std::vector<int64_t>{1, 0})
          Fail("only perm=[1, 0] of a matrix");
        transposed_[n.output(0)] = n.input(0);
        continue;
      }
      if (op == "Conv") {
        OnlyAttributes({"kernel_shape", "strides", "pads", "dilations", "group", "auto_pad"});
        const int64_t groups = Int("group", 1);
        if (groups < 1 || groups > kMaxLayerWidth) {
          Fail("group=" + std::to_string(groups) + " is not a count in [1, " +
               std::to_string(kMaxLayerWidth) + "]");
        }
        int64_t k = 0, s = 0, p = 0, dil = 1;
        std::vector<int64_t> sides;
        Window(&k, &s, &p, &dil, &sides);
        std::string prefix;
        const auto& w = Param(1, "weight", &prefix);
        if (w.dims_size() != 4 || w.dims(2) != k || w.dims(3) != k) {
          Fail("weight '" + n.input(1) + "' does not have the kernel's shape");
        }
        const bool bias = n.input_size() > 2 && !n.input(2).empty();
        if (bias) Param(2, "bias", &prefix);
        layer = std::make_unique<Conv2d>(be_, prefix, w.dims(0), k, s, p, bias, groups, dil);
        from = {Source(n.input(0))};
        if (!sides.empty()) {  // pads that differ between sides: zero-pad first, then conv
          from = {
              graph_->Add(std::make_unique<Pad2d>(be_, "", sides[0], sides[1], sides[2], sides[3]),
                          std::move(from), node_name_ + "/pad")};
        }
      } else if (op == "Gemm") {
        OnlyAttributes({"alpha", "beta", "transA", "transB"});
        if (Int("transA", 0) != 0 || Int("transB", 0) != 1 || Float("alpha", 1) != 1 ||
            Float("beta", 1) != 1) {
          Fail(
              "only y = x W^T + b (transA=0, transB=1, alpha=beta=1, as nn.Linear) is "
              "supported");
        }
        std::string prefix;
        const auto& w = Param(1, "weight", &prefix);
        if (w.dims_size() != 2) Fail("weight '" + n.input(1) + "' is not a matrix");
        const bool bias = n.input_size() > 2 && !n.input(2).empty();
        if (bias) Param(2, "bias", &prefix);
        layer = std::make_unique<Linear>(be_, prefix, w.dims(0), bias);
        from = {Source(n.input(0))};
      } else if (op == "MatMul") {
        OnlyAttributes({});
        const auto t = transposed_.find(n.input(1));
        if (t == transposed_.end()) {
          Fail(
              "only x @ W^T with W a weight in the file (nn.Linear without bias exports it as "
              "MatMul(x, Transpose(W))) is supported; use nn.Linear for x @ W");
        }
        std::string prefix;
        const auto& w = Param(t->second, "weight", &prefix);
        if (w.dims_size() != 2) Fail("weight '" + t->second + "' is not a matrix");
        layer = std::make_unique<Linear>(be_, prefix, w.dims(0), false);
        from = {Source(n.input(0))};
      } else if (op == "Pad") {
        OnlyAttributes({"mode"});
        const auto* mode = Attr("mode");
        if (mode != nullptr && mode->s() != "constant") {
          Fail("mode=" + mode->s() + " is not supported (only constant zero padding)");
        }
        IntTensor pads;
        if (n.input_size() < 2 || !ConstInts(n.input(1), &pads)) {
          Fail("the pads must be constant (as F.pad / nn.ZeroPad2d with fixed amounts export)");
        }
        if (pads.v.size() != 8) Fail("only the padding of (N, C, H, W) tensors is supported");
        if (pads.v[0] != 0 || pads.v[1] != 0 || pads.v[4] != 0 || pads.v[5] != 0) {
          Fail("only the image planes (H, W) can be padded, not the batch or the channels");
        }
        if (ConstScalar(2, "constant value", 0.0) != 0.0) Fail("only zero padding is supported");
        layer = std::make_unique<Pad2d>(be_, "", pads.v[2], pads.v[3], pads.v[6], pads.v[7]);
        from = {Source(n.input(0))};
      } else if (op == "BatchNormalization") {
        OnlyAttributes({"epsilon", "momentum", "training_mode"});
        std::string prefix;
        Param(1, "weight", &prefix);
        Param(2, "bias", &prefix);
        Param(3, "running_mean", &prefix);
        Param(4, "running_var", &prefix);
        BatchNormArgs args;
        args.eps = Decimal(Float("epsilon", 1e-5));
        args.momentum = Decimal(1.0 - Float("momentum", 0.9));  // ONNX keeps 1 - PyTorch's
        layer = std::make_unique<BatchNorm>(be_, prefix, args);
        from = {Source(n.input(0))};
      } else if (op == "Relu") {
        layer = std::make_unique<Relu>(be_, "");
        from = {Source(n.input(0))};
      } else if (op == "Clip" || op == "Sigmoid" || op == "HardSigmoid" || op == "HardSwish" ||
                 op == "Tanh") {
        ew::Activation f;
        if (op == "Clip") {
          OnlyAttributes({});
          const double lo = ConstScalar(1, "min", -HUGE_VAL), hi = ConstScalar(2, "max", HUGE_VAL);
          if (!(lo <= hi))
            Fail("min " + std::to_string(lo) + " is above max " + std::to_string(hi));
          f = {ew::ActKind::kClip, static_cast<float>(lo), static_cast<float>(hi)};
        } else if (op == "HardSigmoid") {
          OnlyAttributes({"alpha", "beta"});
          f = {ew::ActKind::kHardSigmoid, static_cast<float>(Float("alpha", 0.2)),
               static_cast<float>(Float("beta", 0.5))};
        } else {
          OnlyAttributes({});
          f.kind = op == "Sigmoid"     ? ew::ActKind::kSigmoid
                   : op == "HardSwish" ? ew::ActKind::kHardSwish
                                       : ew::ActKind::kTanh;
        }
        layer = std::make_unique<Activation>(be_, "", f);
        from = {Source(n.input(0))};
      } else if (op == "MaxPool" || op == "AveragePool") {
        OnlyAttributes({"kernel_shape", "strides", "pads", "dilations", "ceil_mode", "auto_pad",
                        "storage_order", "count_include_pad"});
        if (Int("storage_order", 0) != 0) Fail("storage_order=1 is not supported");
        int64_t k = 0, s = 0, p = 0;
        Window(&k, &s, &p);
        if (p * 2 > k) {
          Fail("pads " + std::to_string(p) + " exceed half the kernel " + std::to_string(k) +
               " (PyTorch refuses them too)");
        }
        const bool avg = op == "AveragePool";
        // ONNX's count_include_pad defaults to 0; torch.onnx writes nn.AvgPool2d's 1 explicitly.
        layer =
            std::make_unique<Pool2d>(be_, "", avg ? PoolKind::kAvg : PoolKind::kMax, k, s, p,
                                     Int("ceil_mode", 0) != 0, Int("count_include_pad", 0) != 0);
        from = {Source(n.input(0))};
      } else if (op == "GlobalAveragePool") {
        layer = std::make_unique<Pool2d>(be_, "", PoolKind::kAvg, 0, 0, 0);
        from = {Source(n.input(0))};
      } else if (op == "Reshape") {
        OnlyAttributes({"allowzero"});
        if (Int("allowzero", 0) != 0) Fail("allowzero=1 is not supported");
        IntTensor shape;
        if (n.input_size() < 2 || !ConstInts(n.input(1), &shape) || shape.v.empty()) {
          Fail(
              "the shape must be a constant int64 tensor (a shape computed in the graph, as "
              "x.view(x.size(0), -1) exports, is not supported: use torch.flatten(x, 1))");
        }
        const std::vector<int64_t>& dims = shape.v;
        if (dims[0] != 0 && dims[0] != -1) {
          Fail("the shape's first dimension is " + std::to_string(dims[0]) +
               " where the batch goes: the export fixed the batch size (x.view(x.size(0), -1) "
               "exports that way); write torch.flatten(x, 1) or x.view(-1, C*H*W)");
        }
        if (dims[0] == -1 && std::count(dims.begin() + 1, dims.end(), -1) > 0) {
          Fail("with -1 as the batch dimension the other dimensions must be given");
        }
        layer =
            std::make_unique<Reshape>(be_, "", std::vector<int64_t>(dims.begin() + 1, dims.end()));
        from = {Source(n.input(0))};
      } else if (op == "Flatten") {
        OnlyAttributes({"axis"});
        if (Int("axis", 1) != 1) Fail("only axis=1 is supported");
        layer = std::make_unique<Flatten>(be_, "");
        from = {Source(n.input(0))};
      } else if (op == "Add" || op == "Mul" || op == "Concat") {
        if (op == "Mul") {
          OnlyAttributes({});
          if (n.input_size() != 2) Fail("only the product of two inputs is supported");
          layer = std::make_unique<Mul>(be_, "");
        } else if (op == "Concat") {
          OnlyAttributes({"axis"});
          if (Int("axis", 0) != 1) Fail("only axis=1 (the channels) is supported");
          layer = std::make_unique<Concat>(be_, "");
        } else {
          OnlyAttributes({});
          layer = std::make_unique<Add>(be_, "");
        }
        for (const auto& in : n.input()) from.push_back(Source(in));
      } else if (op == "Dropout") {
        OnlyAttributes({"seed"});
        const double ratio = ConstScalar(1, "ratio", 0.5);
        if (!(ratio >= 0 && ratio < 1))
          Fail("ratio " + std::to_string(ratio) + " is not in [0, 1)");
        layer = std::make_unique<Dropout>(be_, "", static_cast<float>(Decimal(ratio)));
        from = {Source(n.input(0))};
      } else if (op == "Shape" || op == "Gather" || op == "Unsqueeze") {
        Fail(op +
             " is not supported: the graph computes a shape from the batch, as "
             "x.view(x.size(0), -1) exports; write torch.flatten(x, 1) or x.view(-1, C*H*W)");
      } else {
        Fail(std::string("op is not supported; dptrain runs ") + kSupported);
      }
      value_[n.output(0)] = graph_->Add(std::move(layer), std::move(from), node_name_);
    } catch (const ConfigError& e) {
      if (problems == nullptr) throw;
      (*problems)[static_cast<size_t>(i)] = problem_;
      // Later nodes reading this one are judged on their own: give its outputs a stand-in.
      for (const auto& o : node_->output()) value_[o] = Graph::kInput;
    }
  }
  if (problems != nullptr) return out;
  const auto it = value_.find(outputs[0]);
  DPT_CHECK_AS(ConfigError, it != value_.end() && graph_->size() > 0 &&
                                it->second == static_cast<int>(graph_->size()) - 1)
      << "model.onnx: " << path_ << ": the output '" << outputs[0]
      << "' must be computed by the file's last node";
  out.graph = std::move(graph_);
  return out;
}

}  // namespace

OnnxModel ImportOnnx(Backend& be, const std::string& path) {
  const onnx::ModelProto m = LoadModel(path);
  return Importer(be, path).Run(m);
}

std::vector<int64_t> OnnxSampleDims(const std::string& path) {
  const onnx::ModelProto m = LoadModel(path);
  std::set<std::string> inits;
  for (const auto& t : m.graph().initializer()) inits.insert(t.name());
  std::vector<int64_t> dims;
  for (const auto& in : m.graph().input()) {
    if (inits.count(in.name()) != 0) continue;
    const auto& d = in.type().tensor_type().shape().dim();
    for (int i = 1; i < d.size(); ++i) dims.push_back(d[i].has_dim_value() ? d[i].dim_value() : 0);
    break;
  }
  return dims;
}

std::string DescribeOnnx(Backend& be, const std::string& path) {
  const onnx::ModelProto m = LoadModel(path);
  const onnx::GraphProto& g = m.graph();
  std::map<size_t, std::string> problems;
  Importer(be, path).Run(m, &problems);
  std::map<std::string, std::string> op_of;
  for (int i = 0; i < g.node_size(); ++i)
    op_of[NodeName(g.node(i), static_cast<size_t>(i))] = g.node(i).op_type();
  std::ostringstream os;
  os << path << ": ONNX model (ir " << m.ir_version() << ", from " << m.producer_name() << " "
     << m.producer_version() << "), " << g.node_size() << " nodes, " << g.initializer_size()
     << " initializers\n";
  const auto row = [&](const std::string& a, const std::string& b, const std::string& c,
                       const std::string& d) {
    char line[512];
    std::snprintf(line, sizeof(line), "%-48s %-20s %-18s %12s\n", a.c_str(), b.c_str(), c.c_str(),
                  d.c_str());
    os << line;
  };
  if (problems.empty()) {
    OnnxModel o = ImportOnnx(be, path);
    bool fixed = !o.sample_dims.empty();
    for (int64_t d : o.sample_dims) fixed = fixed && d > 0;
    if (!fixed) {
      os << "the input's shape is not fixed in the file: shapes follow from the data\n";
      return os.str();
    }
    Model model(be, std::move(o.graph), Shape(o.sample_dims));
    model.Setup(1, Precision::kF32);
    row("node", "op", "output shape", "parameters");
    const Graph& net = model.net();
    for (size_t i = 0; i < net.size(); ++i) {
      std::vector<ParamRef> refs;
      net.layer(i).ListParams(&refs);
      int64_t count = 0;
      for (const auto& r : refs) count += r.shape.numel();
      const auto it = op_of.find(net.node_name(i));
      row(net.node_name(i), it == op_of.end() ? net.layer(i).type() : it->second,
          net.output_shape(i).ToString(), count > 0 ? std::to_string(count) : "");
    }
    os << "input " << Shape(o.sample_dims).ToString() << " per sample; " << model.num_params()
       << " parameters; output " << model.output_shape().ToString() << " (batch 1)\n";
    os << "every op is supported\n";
    return os.str();
  }
  row("node", "op", "", "");
  for (int i = 0; i < g.node_size(); ++i) {
    const auto it = problems.find(static_cast<size_t>(i));
    row(NodeName(g.node(i), static_cast<size_t>(i)), g.node(i).op_type(),
        it == problems.end() ? "" : "NOT SUPPORTED", "");
  }
  os << problems.size() << " node(s) dptrain cannot run:\n";
  for (const auto& [i, why] : problems) {
    os << "  " << NodeName(g.node(static_cast<int>(i)), i) << " ("
       << g.node(static_cast<int>(i)).op_type() << "): " << why << "\n";
  }
  return os.str();
}

}  // namespace dptrain
