// SPDX-License-Identifier: Apache-2.0
// The model part of a run config: a zoo name or an explicit list of layers (DESIGN.md section 7).
// Plain data; parsed and validated by launcher/config, built by models/zoo.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dptrain {

// Bounds on a layer's integers, from model.layers or an ONNX file: far beyond any real model, and
// low enough that no size wraps around in the shape arithmetic or the libraries' descriptors
// (kernel, stride, padding and dilation; output channels, features and groups).
constexpr int64_t kMaxLayerWindow = int64_t{1} << 20;
constexpr int64_t kMaxLayerWidth = int64_t{1} << 24;

struct LayerSpec {     // one entry of model.layers
  std::string type;    // conv2d, linear, relu, relu6, sigmoid, hardsigmoid, hardswish, tanh,
                       // maxpool, avgpool, batchnorm, dropout, flatten, add, mul, concat
  std::string name;    // parameter prefix; default: the index in the list ("0", "1", ...) as in
                       // torch.nn.Sequential, so a state_dict loads with strict=True
  int64_t out = 0;     // conv2d/linear output channels/features
  int64_t kernel = 0;  // conv2d (required), pools (default 2)
  int64_t stride = 1;  // conv2d default 1; pools default = kernel
  int64_t pad = 0;
  bool bias = true;
  double p = 0.5;                    // dropout probability in [0, 1)
  int64_t groups = 1, dilation = 1;  // conv2d, as torch.nn.Conv2d
  bool ceil_mode = false;            // pools, as torch.nn.MaxPool2d / AvgPool2d
  bool count_include_pad = true;     // avgpool
  // Names of the earlier layers whose outputs this layer reads; empty: the previous layer's
  // (the model's input for the first). add, mul and concat take two or more (mul: two).
  std::vector<std::string> inputs;

  bool operator==(const LayerSpec&) const = default;
};

}  // namespace dptrain
