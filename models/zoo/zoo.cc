// SPDX-License-Identifier: Apache-2.0
// Zoo models and the config layer-list builder.
#include "models/zoo/zoo.h"

#include "core/error.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/dropout.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/pool.h"
#include "models/layers/relu.h"
#include "models/layers/residual.h"

namespace dptrain {
namespace {

template <class L, class... A>
void Push(Sequential& s, Backend& be, std::string name, A&&... args) {
  s.Add(std::make_unique<L>(be, std::move(name), std::forward<A>(args)...));
}

std::unique_ptr<Sequential> Linear10(Backend& be) {
  auto s = std::make_unique<Sequential>(be, "");
  Push<Linear>(*s, be, "fc", 1, true);
  return s;
}

std::unique_ptr<Sequential> Mlp(Backend& be, int64_t classes) {
  auto s = std::make_unique<Sequential>(be, "");
  Push<Flatten>(*s, be, "");
  Push<Linear>(*s, be, "fc1", 256, true);
  Push<Relu>(*s, be, "");
  Push<Linear>(*s, be, "fc2", 128, true);
  Push<Relu>(*s, be, "");
  Push<Linear>(*s, be, "fc3", classes, true);
  return s;
}

std::unique_ptr<Sequential> RefCnn(Backend& be, int64_t classes) {
  auto s = std::make_unique<Sequential>(be, "");
  Push<Conv2d>(*s, be, "conv1", 32, 3, 1, 1, true);
  Push<Relu>(*s, be, "");
  Push<Pool2d>(*s, be, "", PoolKind::kMax, 2, 2, 0);
  Push<Conv2d>(*s, be, "conv2", 64, 3, 1, 1, true);
  Push<Relu>(*s, be, "");
  Push<Pool2d>(*s, be, "", PoolKind::kMax, 2, 2, 0);
  Push<Flatten>(*s, be, "");
  Push<Linear>(*s, be, "fc1", 128, true);
  Push<Relu>(*s, be, "");
  Push<Linear>(*s, be, "fc2", classes, true);
  return s;
}

std::unique_ptr<Sequential> CifarNet(Backend& be, int64_t classes) {
  auto s = std::make_unique<Sequential>(be, "");
  Push<Conv2d>(*s, be, "conv1", 64, 3, 1, 1, true);
  Push<Relu>(*s, be, "");
  Push<Pool2d>(*s, be, "", PoolKind::kMax, 2, 2, 0);
  Push<Flatten>(*s, be, "");
  Push<Linear>(*s, be, "fc1", classes, true);  // in-features from the input shape at Setup
  return s;
}

// torchvision-style BasicBlock: conv1 bn1 relu conv2 bn2 (+ shortcut.0 conv1x1, shortcut.1 bn).
std::unique_ptr<Layer> BasicBlock(Backend& be, std::string name, int64_t in, int64_t out,
                                  int64_t stride) {
  auto main = std::make_unique<Sequential>(be, "");
  Push<Conv2d>(*main, be, "conv1", out, 3, stride, 1, false);
  Push<BatchNorm>(*main, be, "bn1");
  Push<Relu>(*main, be, "");
  Push<Conv2d>(*main, be, "conv2", out, 3, 1, 1, false);
  Push<BatchNorm>(*main, be, "bn2");
  auto shortcut = std::make_unique<Sequential>(be, "shortcut");
  if (stride != 1 || in != out) {
    Push<Conv2d>(*shortcut, be, "0", out, 1, stride, 0, false);
    Push<BatchNorm>(*shortcut, be, "1");
  }
  auto block = std::make_unique<Sequential>(be, std::move(name));
  block->Add(std::make_unique<Residual>(be, "", std::move(main), std::move(shortcut)));
  Push<Relu>(*block, be, "");
  return block;
}

std::unique_ptr<Sequential> ResNet8(Backend& be, int64_t classes) {
  auto s = std::make_unique<Sequential>(be, "");
  Push<Conv2d>(*s, be, "conv1", 16, 3, 1, 1, false);
  Push<BatchNorm>(*s, be, "bn1");
  Push<Relu>(*s, be, "");
  // "layer1.0.conv1.weight": a stage is a Sequential named layerK holding block "0".
  const int64_t widths[3] = {16, 32, 64};
  int64_t in = 16;
  for (int k = 0; k < 3; ++k) {
    auto stage = std::make_unique<Sequential>(be, "layer" + std::to_string(k + 1));
    stage->Add(BasicBlock(be, "0", in, widths[k], k == 0 ? 1 : 2));
    s->Add(std::move(stage));
    in = widths[k];
  }
  Push<Pool2d>(*s, be, "", PoolKind::kAvg, 0, 0, 0);
  Push<Flatten>(*s, be, "");
  Push<Linear>(*s, be, "fc", classes, true);
  return s;
}

}  // namespace

std::vector<std::string> ZooNames() { return {"linear", "mlp", "ref_cnn", "cifar_net", "resnet8"}; }

std::unique_ptr<Sequential> BuildZooModel(Backend& be, const std::string& name, int64_t classes) {
  if (name == "linear") return Linear10(be);
  if (name == "mlp") return Mlp(be, classes);
  if (name == "ref_cnn") return RefCnn(be, classes);
  if (name == "cifar_net") return CifarNet(be, classes);
  if (name == "resnet8") return ResNet8(be, classes);
  std::string known;
  for (const auto& n : ZooNames()) known += (known.empty() ? "" : ", ") + n;
  DPT_THROW(ConfigError) << "model.name: unknown model '" << name << "' (known: " << known
                         << "; or give model.layers)";
}

std::unique_ptr<Sequential> BuildFromLayers(Backend& be, const std::vector<LayerSpec>& layers) {
  DPT_CHECK_AS(ConfigError, !layers.empty()) << "model.layers is empty";
  auto s = std::make_unique<Sequential>(be, "");
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    std::string name = l.name.empty() ? std::to_string(i) : l.name;
    if (l.type == "conv2d") {
      Push<Conv2d>(*s, be, name, l.out, l.kernel, l.stride, l.pad, l.bias);
    } else if (l.type == "linear") {
      Push<Linear>(*s, be, name, l.out, l.bias);
    } else if (l.type == "relu") {
      Push<Relu>(*s, be, name);
    } else if (l.type == "maxpool" || l.type == "avgpool") {
      // The config gives pools stride = kernel unless written; 0 here means "as the kernel".
      const int64_t k = l.kernel == 0 ? 2 : l.kernel;
      const int64_t stride = l.stride > 0 ? l.stride : k;
      Push<Pool2d>(*s, be, name, l.type == "maxpool" ? PoolKind::kMax : PoolKind::kAvg, k, stride,
                   l.pad);
    } else if (l.type == "batchnorm") {
      Push<BatchNorm>(*s, be, name);
    } else if (l.type == "dropout") {
      Push<Dropout>(*s, be, name, static_cast<float>(l.p));
    } else if (l.type == "flatten") {
      Push<Flatten>(*s, be, name);
    } else {
      DPT_THROW(ConfigError) << "model.layers[" << i << "].type: unknown layer type '" << l.type
                             << "'";
    }
  }
  return s;
}

LossKind DefaultLoss(const std::string& zoo_name) {
  return zoo_name == "linear" ? LossKind::kMse : LossKind::kCrossEntropy;
}

Shape DefaultInputShape(const std::string& zoo_name) {
  if (zoo_name == "linear") return Shape{10};
  if (zoo_name == "cifar_net" || zoo_name == "resnet8") return Shape{3, 32, 32};
  return Shape{1, 28, 28};
}

}  // namespace dptrain
