// SPDX-License-Identifier: Apache-2.0
// The facts derived from a TrainConfig in one place: the loss, the default sample shape and the
// model's graph from whichever front end the config names.
#include "runtime/run_config.h"

#include "core/error.h"
#include "models/onnx/onnx_import.h"
#include "models/zoo/zoo.h"

namespace dptrain {

LossKind ResolveLoss(const ModelConfig& m) {
  switch (m.loss) {
    case LossChoice::kCrossEntropy:
      return LossKind::kCrossEntropy;
    case LossChoice::kMse:
      return LossKind::kMse;
    case LossChoice::kAuto:
      break;
  }
  return m.name.empty() ? LossKind::kCrossEntropy : DefaultLoss(m.name);
}

bool IsSynthetic(const std::vector<std::string>& files) {
  return files.size() == 1 && files.front() == "synthetic";
}

std::string DescribeFiles(const std::vector<std::string>& files) {
  std::string out;
  for (const std::string& f : files) out += (out.empty() ? "" : ", ") + f;
  return out;
}

Shape DefaultSampleShape(const ModelConfig& m) {
  if (!m.onnx.empty()) {
    const std::vector<int64_t> dims = OnnxSampleDims(m.onnx);
    for (int64_t d : dims) {
      DPT_CHECK_AS(ConfigError, d > 0)
          << "model.onnx: " << m.onnx << " does not fix its input's shape, and without a data "
          << "file nothing else says it; export with a fixed example input, or give data.train";
    }
    return Shape(dims);
  }
  return m.name.empty() ? Shape{1, 28, 28} : DefaultInputShape(m.name);
}

namespace {

// The network of model.name, model.layers or model.onnx.
std::unique_ptr<Graph> BuildGraph(Backend& be, const ModelConfig& m, const Shape& sample) {
  if (!m.onnx.empty()) {
    OnnxModel o = ImportOnnx(be, m.onnx);
    bool fits = o.sample_dims.size() == static_cast<size_t>(sample.rank());
    for (size_t i = 0; fits && i < o.sample_dims.size(); ++i) {
      fits = o.sample_dims[i] == 0 || o.sample_dims[i] == sample[static_cast<int>(i)];
    }
    if (!fits) {
      std::string want = "[";
      for (size_t i = 0; i < o.sample_dims.size(); ++i) {
        want += (i > 0 ? ", " : "") +
                (o.sample_dims[i] > 0 ? std::to_string(o.sample_dims[i]) : std::string("?"));
      }
      DPT_THROW(ConfigError) << "model.onnx: " << m.onnx << " takes samples of shape " << want
                             << "] but the data's samples are " << sample.ToString()
                             << "; export the model with an example input of the data's shape";
    }
    return std::move(o.graph);
  }
  return m.name.empty() ? BuildFromLayers(be, m.layers) : BuildZooModel(be, m.name, m.classes);
}

}  // namespace

std::unique_ptr<Graph> BuildNet(Backend& be, const ModelConfig& m, const MemoryConfig& mem,
                                const Shape& sample) {
  std::unique_ptr<Graph> g = BuildGraph(be, m, sample);
  g->set_channels_last(m.channels_last);
  g->set_recompute(mem.recompute);
  return g;
}

}  // namespace dptrain
