// SPDX-License-Identifier: Apache-2.0
// The model zoo and the builder for models given as a list of layers in the config. Parameter
// names follow PyTorch module naming (DESIGN.md section 5).
//
//   linear     Linear 10 -> 1 (input (10)); loss mse
//   mlp        flatten, fc1 -> 256, relu, fc2 -> 128, relu, fc3 -> classes
//   ref_cnn    conv1 1->32 3x3 p1, relu, maxpool 2, conv2 32->64 3x3 p1, relu, maxpool 2,
//              flatten, fc1 3136->128, relu, fc2 128->classes   (for 1x28x28 input)
//   cifar_net  conv1 3->64 3x3 p1, relu, maxpool 2, flatten, fc1 -> classes (flatten size from
//              the input shape: 64*16*16 for 32x32)
//   resnet8    CIFAR ResNet (6n+2, n=1): conv1 3x3 16 + bn1 + relu, layer1..3 of one BasicBlock
//              each (16, 32/2, 64/2 channels/stride, 1x1 conv + bn shortcut when the shape
//              changes), global avgpool, flatten, fc -> classes
//   resnet18, resnet50   torchvision's ResNet-18 (BasicBlocks 2-2-2-2) and ResNet-50 (v1.5
//              Bottlenecks 3-4-6-3), same parameter names ("layer1.0.downsample.0.weight"), the
//              ImageNet stem (conv1 7x7/2, maxpool 3/2); input (3, 224, 224)
//   resnet18_cifar, resnet50_cifar   the same with a CIFAR stem (conv1 3x3/1, no max pool), for
//              32x32 images
// Every model is a Graph; model.layers is a chain unless a layer names its inputs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/graph.h"
#include "models/loss.h"
#include "models/model_spec.h"

namespace dptrain {

std::vector<std::string> ZooNames();
// Throws ConfigError naming `name` and the known names when unknown.
std::unique_ptr<Graph> BuildZooModel(Backend& be, const std::string& name, int64_t classes);
std::unique_ptr<Graph> BuildFromLayers(Backend& be, const std::vector<LayerSpec>& layers);
// The loss a zoo model trains with by default (linear: mse; the rest: cross-entropy).
LossKind DefaultLoss(const std::string& zoo_name);
// Input shape a zoo model expects when the data does not say (synthetic data): linear (10),
// ref_cnn / mlp (1, 28, 28), cifar_net / resnet8 / resnet*_cifar (3, 32, 32), resnet18 / resnet50
// (3, 224, 224).
Shape DefaultInputShape(const std::string& zoo_name);

}  // namespace dptrain
