// SPDX-License-Identifier: Apache-2.0
// ONNX import (model.onnx): the file torch.onnx.export(model, x, FILE,
// training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False) writes, opset 13 to 17,
// becomes a Graph. Parsed and checked with the ONNX project's own library (libonnx).
//
// Contract:
//  - The graph has one input, the batch (N, C, H, W) or (N, features), and one output, the
//    logits (N, classes); dptrain adds the loss.
//  - The file's float initializers are the starting weights, under their ONNX names, which are
//    the PyTorch state_dict names: a node's weight "layer1.0.conv1.weight" makes the layer
//    "layer1.0.conv1". Batch-norm running mean and variance are buffers; everything else that a
//    layer trains is a parameter; constants (dropout ratios) are neither.
//  - Supported (ImportableOps()): Conv (square kernel, equal strides, symmetric pads, no
//    dilation, one group), Gemm (transB = 1, alpha = beta = 1), Relu, MaxPool and AveragePool
//    (square, symmetric pads, floor mode), GlobalAveragePool, BatchNormalization (momentum and
//    epsilon as exported; trained with batch statistics), Add and Concat (axis 1) of node
//    outputs, Flatten (axis 1), Dropout, Identity, Constant.
//  - Anything else, and a file that is not ONNX, a truncated one, an opset outside 13..17, more
//    than one input or output, or an initializer that is missing or of the wrong type: a
//    ConfigError (exit 2) naming the file and the node. Never an approximation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/graph.h"

namespace dptrain {

struct OnnxModel {
  std::unique_ptr<Graph> graph;  // with the initializers as its initial values
  // The input's dimensions after the batch, as the file declares them (0: not fixed there).
  std::vector<int64_t> sample_dims;
};

OnnxModel ImportOnnx(Backend& be, const std::string& path);
// Only the input's dimensions after the batch (0 where the file does not fix one).
std::vector<int64_t> OnnxSampleDims(const std::string& path);

// `dptrain inspect FILE.onnx`: the graph as a table (node, op, output shape, parameters) for a
// batch of 1, the parameter count, and every node dptrain cannot run with the reason. Throws
// ConfigError when the file is not ONNX.
std::string DescribeOnnx(Backend& be, const std::string& path);

}  // namespace dptrain
