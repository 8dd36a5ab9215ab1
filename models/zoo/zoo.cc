// SPDX-License-Identifier: Apache-2.0
// Zoo models and the config layer-list builder.
#include "models/zoo/zoo.h"

#include <map>
#include <optional>

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

namespace dptrain {
namespace {

// Appends a layer reading the previous node's output; returns its node index.
template <class L, class... A>
int Push(Graph& g, Backend& be, std::string name, A&&... args) {
  return g.Add(std::make_unique<L>(be, std::move(name), std::forward<A>(args)...));
}
// Appends a layer reading the outputs of `inputs`.
template <class L, class... A>
int PushFrom(Graph& g, const std::vector<int>& inputs, Backend& be, std::string name, A&&... args) {
  return g.Add(std::make_unique<L>(be, std::move(name), std::forward<A>(args)...), inputs);
}

std::unique_ptr<Graph> Linear10(Backend& be) {
  auto g = std::make_unique<Graph>(be);
  Push<Linear>(*g, be, "fc", 1, true);
  return g;
}

std::unique_ptr<Graph> Mlp(Backend& be, int64_t classes) {
  auto g = std::make_unique<Graph>(be);
  Push<Flatten>(*g, be, "");
  Push<Linear>(*g, be, "fc1", 256, true);
  Push<Relu>(*g, be, "");
  Push<Linear>(*g, be, "fc2", 128, true);
  Push<Relu>(*g, be, "");
  Push<Linear>(*g, be, "fc3", classes, true);
  return g;
}

std::unique_ptr<Graph> RefCnn(Backend& be, int64_t classes) {
  auto g = std::make_unique<Graph>(be);
  Push<Conv2d>(*g, be, "conv1", 32, 3, 1, 1, true);
  Push<Relu>(*g, be, "");
  Push<Pool2d>(*g, be, "", PoolKind::kMax, 2, 2, 0);
  Push<Conv2d>(*g, be, "conv2", 64, 3, 1, 1, true);
  Push<Relu>(*g, be, "");
  Push<Pool2d>(*g, be, "", PoolKind::kMax, 2, 2, 0);
  Push<Flatten>(*g, be, "");
  Push<Linear>(*g, be, "fc1", 128, true);
  Push<Relu>(*g, be, "");
  Push<Linear>(*g, be, "fc2", classes, true);
  return g;
}

std::unique_ptr<Graph> CifarNet(Backend& be, int64_t classes) {
  auto g = std::make_unique<Graph>(be);
  Push<Conv2d>(*g, be, "conv1", 64, 3, 1, 1, true);
  Push<Relu>(*g, be, "");
  Push<Pool2d>(*g, be, "", PoolKind::kMax, 2, 2, 0);
  Push<Flatten>(*g, be, "");
  Push<Linear>(*g, be, "fc1", classes, true);  // in-features from the input shape at Setup
  return g;
}

// The projection shortcut of a block whose shape changes: 1x1 conv + batch norm, named
// "<p><shortcut>.0" / ".1" (torchvision: "downsample"; resnet8: "shortcut"). Returns the node
// the block's sum reads: `x` itself when the shape does not change.
int Shortcut(Graph& g, Backend& be, const std::string& p, const char* shortcut, int x, int64_t in,
             int64_t out, int64_t stride) {
  if (stride == 1 && in == out) return x;
  PushFrom<Conv2d>(g, {x}, be, p + shortcut + ".0", out, 1, stride, 0, false);
  return Push<BatchNorm>(g, be, p + shortcut + ".1");
}

// torchvision's BasicBlock at prefix p ("layer1.0."): conv1 bn1 relu conv2 bn2, + shortcut,
// relu. Returns the block's output node.
int BasicBlock(Graph& g, Backend& be, const std::string& p, const char* shortcut, int x, int64_t in,
               int64_t out, int64_t stride) {
  PushFrom<Conv2d>(g, {x}, be, p + "conv1", out, 3, stride, 1, false);
  Push<BatchNorm>(g, be, p + "bn1");
  Push<Relu>(g, be, p + "relu");
  Push<Conv2d>(g, be, p + "conv2", out, 3, 1, 1, false);
  const int main = Push<BatchNorm>(g, be, p + "bn2");
  const int sc = Shortcut(g, be, p, shortcut, x, in, out, stride);
  PushFrom<Add>(g, {main, sc}, be, p + "add");
  return Push<Relu>(g, be, p + "relu_1");
}

// torchvision's Bottleneck (ResNet v1.5: the stride on the 3x3 conv): conv1 1x1, conv2 3x3,
// conv3 1x1 to 4x the width, each with batch norm; + downsample, relu.
int Bottleneck(Graph& g, Backend& be, const std::string& p, int x, int64_t in, int64_t width,
               int64_t stride) {
  const int64_t out = 4 * width;
  PushFrom<Conv2d>(g, {x}, be, p + "conv1", width, 1, 1, 0, false);
  Push<BatchNorm>(g, be, p + "bn1");
  Push<Relu>(g, be, p + "relu");
  Push<Conv2d>(g, be, p + "conv2", width, 3, stride, 1, false);
  Push<BatchNorm>(g, be, p + "bn2");
  Push<Relu>(g, be, p + "relu_1");
  Push<Conv2d>(g, be, p + "conv3", out, 1, 1, 0, false);
  const int main = Push<BatchNorm>(g, be, p + "bn3");
  const int sc = Shortcut(g, be, p, "downsample", x, in, out, stride);
  PushFrom<Add>(g, {main, sc}, be, p + "add");
  return Push<Relu>(g, be, p + "relu_2");
}

std::unique_ptr<Graph> ResNet8(Backend& be, int64_t classes) {
  auto g = std::make_unique<Graph>(be);
  Push<Conv2d>(*g, be, "conv1", 16, 3, 1, 1, false);
  Push<BatchNorm>(*g, be, "bn1");
  int x = Push<Relu>(*g, be, "relu");
  // "layer1.0.conv1.weight": stage layerK holds one block "0".
  const int64_t widths[3] = {16, 32, 64};
  int64_t in = 16;
  for (int k = 0; k < 3; ++k) {
    const std::string p = "layer" + std::to_string(k + 1) + ".0.";
    x = BasicBlock(*g, be, p, "shortcut", x, in, widths[k], k == 0 ? 1 : 2);
    in = widths[k];
  }
  Push<Pool2d>(*g, be, "avgpool", PoolKind::kAvg, 0, 0, 0);
  Push<Flatten>(*g, be, "flatten");
  Push<Linear>(*g, be, "fc", classes, true);
  return g;
}

// torchvision's resnet18 / resnet50 (same module names, so state_dicts interchange). The
// ImageNet stem is conv1 7x7/2 + bn + relu + maxpool 3/2; the CIFAR stem (`cifar`) is conv1
// 3x3/1 + bn + relu without the max pool, for 32x32 images.
std::unique_ptr<Graph> ResNet(Backend& be, int depth, bool cifar, int64_t classes) {
  auto g = std::make_unique<Graph>(be);
  if (cifar) {
    Push<Conv2d>(*g, be, "conv1", 64, 3, 1, 1, false);
  } else {
    Push<Conv2d>(*g, be, "conv1", 64, 7, 2, 3, false);
  }
  Push<BatchNorm>(*g, be, "bn1");
  int x = Push<Relu>(*g, be, "relu");
  if (!cifar) x = Push<Pool2d>(*g, be, "maxpool", PoolKind::kMax, 3, 2, 1);
  const bool bottleneck = depth == 50;
  const int blocks[4] = {depth == 18 ? 2 : 3, depth == 18 ? 2 : 4, depth == 18 ? 2 : 6,
                         depth == 18 ? 2 : 3};
  int64_t in = 64;
  for (int k = 0; k < 4; ++k) {
    const int64_t width = int64_t{64} << k;
    for (int b = 0; b < blocks[k]; ++b) {
      const std::string p = "layer" + std::to_string(k + 1) + "." + std::to_string(b) + ".";
      const int64_t stride = k > 0 && b == 0 ? 2 : 1;
      if (bottleneck) {
        x = Bottleneck(*g, be, p, x, in, width, stride);
        in = 4 * width;
      } else {
        x = BasicBlock(*g, be, p, "downsample", x, in, width, stride);
        in = width;
      }
    }
  }
  Push<Pool2d>(*g, be, "avgpool", PoolKind::kAvg, 0, 0, 0);
  Push<Flatten>(*g, be, "flatten");
  Push<Linear>(*g, be, "fc", classes, true);
  return g;
}

}  // namespace

std::vector<std::string> ZooNames() {
  return {"linear",   "mlp",      "ref_cnn",        "cifar_net",     "resnet8",
          "resnet18", "resnet50", "resnet18_cifar", "resnet50_cifar"};
}

std::unique_ptr<Graph> BuildZooModel(Backend& be, const std::string& name, int64_t classes) {
  if (name == "linear") return Linear10(be);
  if (name == "mlp") return Mlp(be, classes);
  if (name == "ref_cnn") return RefCnn(be, classes);
  if (name == "cifar_net") return CifarNet(be, classes);
  if (name == "resnet8") return ResNet8(be, classes);
  if (name == "resnet18") return ResNet(be, 18, false, classes);
  if (name == "resnet50") return ResNet(be, 50, false, classes);
  if (name == "resnet18_cifar") return ResNet(be, 18, true, classes);
  if (name == "resnet50_cifar") return ResNet(be, 50, true, classes);
  std::string known;
  for (const auto& n : ZooNames()) known += (known.empty() ? "" : ", ") + n;
  DPT_THROW(ConfigError) << "model.name: unknown model '" << name << "' (known: " << known
                         << "; or give model.layers)";
}

namespace {

// The model.layers types of the pointwise activations, as PyTorch's modules define them.
std::optional<ew::Activation> ActivationOf(const std::string& type) {
  using K = ew::ActKind;
  if (type == "relu6") return ew::Activation{K::kClip, 0.f, 6.f};
  if (type == "sigmoid") return ew::Activation{K::kSigmoid};
  if (type == "hardsigmoid") return ew::Activation{K::kHardSigmoid, 1.f / 6.f, 0.5f};
  if (type == "hardswish") return ew::Activation{K::kHardSwish};
  if (type == "tanh") return ew::Activation{K::kTanh};
  return std::nullopt;
}

}  // namespace

std::unique_ptr<Graph> BuildFromLayers(Backend& be, const std::vector<LayerSpec>& layers) {
  DPT_CHECK_AS(ConfigError, !layers.empty()) << "model.layers is empty";
  auto g = std::make_unique<Graph>(be);
  std::map<std::string, int> node_of;  // layer name -> node
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    std::string name = l.name.empty() ? std::to_string(i) : l.name;
    std::vector<int> inputs;
    for (const std::string& in : l.inputs) {
      const auto it = node_of.find(in);
      DPT_CHECK_AS(ConfigError, it != node_of.end())
          << "model.layers[" << i << "].inputs: \"" << in << "\" is not an earlier layer";
      inputs.push_back(it->second);
    }
    std::unique_ptr<Layer> layer;
    if (l.type == "conv2d") {
      layer = std::make_unique<Conv2d>(be, name, l.out, l.kernel, l.stride, l.pad, l.bias, l.groups,
                                       l.dilation);
    } else if (l.type == "linear") {
      layer = std::make_unique<Linear>(be, name, l.out, l.bias);
    } else if (l.type == "relu") {
      layer = std::make_unique<Relu>(be, name);
    } else if (const auto act = ActivationOf(l.type)) {
      layer = std::make_unique<Activation>(be, name, *act);
    } else if (l.type == "maxpool" || l.type == "avgpool") {
      // The config gives pools stride = kernel unless written; 0 here means "as the kernel".
      const int64_t k = l.kernel == 0 ? 2 : l.kernel;
      const int64_t stride = l.stride > 0 ? l.stride : k;
      layer =
          std::make_unique<Pool2d>(be, name, l.type == "maxpool" ? PoolKind::kMax : PoolKind::kAvg,
                                   k, stride, l.pad, l.ceil_mode, l.count_include_pad);
    } else if (l.type == "batchnorm") {
      layer = std::make_unique<BatchNorm>(be, name);
    } else if (l.type == "dropout") {
      layer = std::make_unique<Dropout>(be, name, static_cast<float>(l.p));
    } else if (l.type == "flatten") {
      layer = std::make_unique<Flatten>(be, name);
    } else if (l.type == "add") {
      layer = std::make_unique<Add>(be, name);
    } else if (l.type == "mul") {
      layer = std::make_unique<Mul>(be, name);
    } else if (l.type == "concat") {
      layer = std::make_unique<Concat>(be, name);
    } else {
      DPT_THROW(ConfigError) << "model.layers[" << i << "].type: unknown layer type '" << l.type
                             << "'";
    }
    node_of[name] = g->Add(std::move(layer), std::move(inputs));
  }
  return g;
}

LossKind DefaultLoss(const std::string& zoo_name) {
  return zoo_name == "linear" ? LossKind::kMse : LossKind::kCrossEntropy;
}

Shape DefaultInputShape(const std::string& zoo_name) {
  if (zoo_name == "linear") return Shape{10};
  if (zoo_name == "cifar_net" || zoo_name == "resnet8" || zoo_name == "resnet18_cifar" ||
      zoo_name == "resnet50_cifar") {
    return Shape{3, 32, 32};
  }
  if (zoo_name == "resnet18" || zoo_name == "resnet50") return Shape{3, 224, 224};
  return Shape{1, 28, 28};
}

}  // namespace dptrain
