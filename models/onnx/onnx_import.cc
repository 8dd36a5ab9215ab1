// SPDX-License-Identifier: Apache-2.0
// ONNX import: parse and check with libonnx, then map node by node onto dptrain layers. The
// translation keeps PyTorch's names: a layer is named after its weight's prefix, a node after
// the ONNX node, so errors and memory reports point at what the user wrote.
#include "models/onnx/onnx_import.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "models/layers/activation.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/dropout.h"
#include "models/layers/flatten.h"
#include "models/layers/join.h"
#include "models/layers/linear.h"
#include "models/layers/pool.h"
#include "models/layers/relu.h"
#include "models/model.h"

namespace dptrain {
namespace {

constexpr char kSupported[] =
    "Conv (groups, dilations), Gemm, Relu, Clip, Sigmoid, HardSigmoid, HardSwish, Tanh, MaxPool, "
    "AveragePool, GlobalAveragePool, BatchNormalization, Add, Mul (equal shapes or [N, C, 1, 1]), "
    "Concat, Flatten, Reshape (to a constant shape keeping the batch), Dropout, Identity, Constant";
constexpr char kExport[] =
    "torch.onnx.export(model, x, FILE, training=torch.onnx.TrainingMode.TRAINING, "
    "do_constant_folding=False)";

onnx::ModelProto LoadModel(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DPT_CHECK_AS(ConfigError, in.good())
      << "model.onnx: cannot open " << path << ": " << std::strerror(errno);
  onnx::ModelProto m;
  DPT_CHECK_AS(ConfigError, m.ParseFromIstream(&in) && m.has_graph() && m.ir_version() > 0)
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
      << "; dptrain reads opsets 13 to 17 (torch.onnx.export(..., opset_version=13))";
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
  // `dilation` is given).
  void Window(int64_t* kernel, int64_t* stride, int64_t* pad, int64_t* dilation = nullptr) const;
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

  // The graph node that computes value `name` (kInput for the graph input).
  int Source(const std::string& name) const {
    const auto it = value_.find(name);
    if (it == value_.end()) {
      if (init_.count(name) != 0)
        Fail("input '" + name +
             "' is an initializer; dptrain runs "
             "this op on computed tensors only");
      Fail("input '" + name + "' is not computed by an earlier node");
    }
    return it->second;
  }
  // The initializer feeding input `k` of the node, which must be named `<prefix>.<suffix>`
  // (the PyTorch parameter name); sets prefix when empty. Stores its values as the parameter's
  // starting value.
  const onnx::TensorProto& Param(int k, const char* suffix, std::string* prefix);

  Backend& be_;
  std::string path_;
  std::unique_ptr<Graph> graph_;
  std::map<std::string, const onnx::TensorProto*> init_;
  std::map<std::string, const onnx::TensorProto*> const_;  // Constant node outputs
  std::map<std::string, int> value_;                       // value name -> graph node
  std::set<std::string> read_;                             // values some node or output reads
};

void Importer::Window(int64_t* kernel, int64_t* stride, int64_t* pad, int64_t* dilation) const {
  NoAutoPad();
  const auto k = Ints("kernel_shape", {});
  if (k.size() != 2 || k[0] != k[1]) Fail("only square 2-D kernels are supported");
  const auto s = Ints("strides", {1, 1});
  if (s.size() != 2 || s[0] != s[1]) Fail("only equal strides are supported");
  const auto p = Ints("pads", {0, 0, 0, 0});
  if (p.size() != 4 || p[0] != p[1] || p[0] != p[2] || p[0] != p[3]) {
    Fail("only equal pads on every side are supported");
  }
  const auto d = Ints("dilations", {1, 1});
  if (d.size() != 2 || d[0] != d[1]) Fail("only equal dilations are supported");
  if (dilation == nullptr && d[0] != 1) Fail("dilations other than 1 are not supported");
  if (dilation != nullptr) *dilation = d[0];
  *kernel = k[0];
  *stride = s[0];
  *pad = p[0];
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
  const std::string& name = node_->input(k);
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
  graph_->SetInitialValue(name, std::move(v));
  return *it->second;
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
      if (op == "Identity") {
        value_[n.output(0)] = Source(n.input(0));
        continue;
      }
      if (op == "Conv") {
        OnlyAttributes({"kernel_shape", "strides", "pads", "dilations", "group", "auto_pad"});
        const int64_t groups = Int("group", 1);
        if (groups < 1) Fail("group=" + std::to_string(groups) + " is not a positive count");
        int64_t k = 0, s = 0, p = 0, dil = 1;
        Window(&k, &s, &p, &dil);
        std::string prefix;
        const auto& w = Param(1, "weight", &prefix);
        if (w.dims_size() != 4 || w.dims(2) != k || w.dims(3) != k) {
          Fail("weight '" + n.input(1) + "' does not have the kernel's shape");
        }
        const bool bias = n.input_size() > 2 && !n.input(2).empty();
        if (bias) Param(2, "bias", &prefix);
        layer = std::make_unique<Conv2d>(be_, prefix, w.dims(0), k, s, p, bias, groups, dil);
        from = {Source(n.input(0))};
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
        if (Int("ceil_mode", 0) != 0) Fail("ceil_mode=1 is not supported yet");
        if (Int("storage_order", 0) != 0) Fail("storage_order=1 is not supported");
        int64_t k = 0, s = 0, p = 0;
        Window(&k, &s, &p);
        const bool avg = op == "AveragePool";
        if (avg && p > 0 && Int("count_include_pad", 0) == 0) {
          Fail(
              "count_include_pad=0 with padding is not supported yet (dptrain's average "
              "counts the padding, as nn.AvgPool2d does by default)");
        }
        layer = std::make_unique<Pool2d>(be_, "", avg ? PoolKind::kAvg : PoolKind::kMax, k, s, p);
        from = {Source(n.input(0))};
      } else if (op == "GlobalAveragePool") {
        layer = std::make_unique<Pool2d>(be_, "", PoolKind::kAvg, 0, 0, 0);
        from = {Source(n.input(0))};
      } else if (op == "Reshape") {
        OnlyAttributes({"allowzero"});
        if (Int("allowzero", 0) != 0) Fail("allowzero=1 is not supported");
        const onnx::TensorProto* t = n.input_size() > 1 ? ConstantValue(n.input(1)) : nullptr;
        std::vector<int64_t> dims;
        if (t == nullptr || !ReadInts(*t, &dims) || dims.empty()) {
          Fail(
              "the shape must be a constant int64 tensor (a shape computed in the graph, as "
              "x.view(x.size(0), -1) exports, is not supported: use torch.flatten(x, 1))");
        }
        if (dims[0] != 0 && dims[0] != -1) {
          Fail("the shape's first dimension is " + std::to_string(dims[0]) +
               "; it must keep the batch (0 or -1, as x.view(-1, ...) exports)");
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
