// SPDX-License-Identifier: Apache-2.0
// Layer-level gradient checks: every layer type, wired into small models, against central
// differences of the model's own forward (f32 on the CPU backend, so a looser tolerance than the
// double-precision checks of the reference ops). Loss = sum(r * y) with a fixed random r, and
// the real losses (softmax cross-entropy, MSE) through the Loss class.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/backend_registry.h"
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
#include "models/loss.h"
#include "models/model.h"
#include "models/zoo/zoo.h"
#include "tests/testing/backends.h"

namespace dptrain {
namespace {

using testing::RandomUniform;
using testing::ToDevice;
using testing::ToHost;

struct Case {
  std::unique_ptr<Model> model;
  Tensor x;
  int64_t n;
};

// Checks d(loss)/d(param) for up to `per_tensor` entries of every parameter tensor.
void CheckParamGrads(Model& m, const Tensor& x, const std::function<double(const Tensor&)>& loss,
                     const std::function<Tensor(const Tensor&)>& dloss, int per_tensor = 12,
                     float eps = 1e-2f, double tol = 3e-3) {
  Backend& be = m.backend();
  ForwardContext ctx;
  ctx.training = true;
  ctx.seed = 5;
  const Tensor& y = m.Forward(x, ctx);
  Tensor dy = dloss(y);
  m.Backward(dy, false);
  const std::vector<float> grads = ToHost(be, m.grads());
  std::vector<float> params = ToHost(be, m.params());
  int checked = 0, skipped = 0;
  for (const auto& p : m.named_params()) {
    const int64_t count = p.tensor.numel();
    const int64_t stride = std::max<int64_t>(1, count / per_tensor);
    for (int64_t j = 0; j < count; j += stride) {
      const size_t idx = static_cast<size_t>(p.offset + j);
      const float orig = params[idx];
      auto at = [&](float v) {
        params[idx] = v;
        be.CopyFromHost(params.data(), &m.params());
        return loss(m.Forward(x, ctx));
      };
      const double n1 = (at(orig + eps) - at(orig - eps)) / (2.0 * eps);
      const double n2 = (at(orig + eps / 2) - at(orig - eps / 2)) / static_cast<double>(eps);
      params[idx] = orig;
      be.CopyFromHost(params.data(), &m.params());
      const double numeric = n2;
      const double analytic = grads[idx];
      // Two step sizes disagree: a ReLU / max-pool kink lies within eps of this point, where
      // finite differences mean nothing. Skip it (rare; counted below).
      if (std::abs(n1 - n2) > tol * std::max({1.0, std::abs(n1), std::abs(n2)})) {
        ++skipped;
        continue;
      }
      ++checked;
      EXPECT_LE(std::abs(analytic - numeric),
                tol * std::max({1.0, std::abs(analytic), std::abs(numeric)}))
          << p.name << "[" << j << "]: analytic " << analytic << " numeric " << numeric;
    }
  }
  EXPECT_GE(checked, 4 * skipped) << checked << " entries checked, " << skipped
                                  << " skipped next to a kink";
}

// Loss sum(r * y) with a fixed random r.
void CheckWithRandomProjection(Model& m, const Tensor& x, float eps = 1e-2f) {
  Backend& be = m.backend();
  const Shape ys = m.output_shape().WithBatch(x.shape()[0]);
  const std::vector<float> r = RandomUniform(static_cast<size_t>(ys.numel()), 99);
  Tensor rt = ToDevice(be, r, ys);
  auto loss = [&](const Tensor& y) {
    const auto v = ToHost(be, y);
    double s = 0;
    for (size_t i = 0; i < v.size(); ++i) s += static_cast<double>(r[i]) * v[i];
    return s;
  };
  CheckParamGrads(
      m, x, loss, [&](const Tensor&) { return rt; }, 12, eps);
}

std::unique_ptr<Model> Build(std::vector<LayerSpec> specs, Shape in, int64_t batch) {
  Backend& be = GetBackend("cpu");
  auto m = std::make_unique<Model>(be, BuildFromLayers(be, specs), in);
  m->Setup(batch, Precision::kF32);
  m->InitParams(11);
  return m;
}

LayerSpec L(std::string type, int64_t out = 0, int64_t kernel = 0, int64_t stride = 1,
            int64_t pad = 0) {
  LayerSpec s;
  s.type = std::move(type);
  s.out = out;
  s.kernel = kernel;
  s.stride = stride;
  s.pad = pad;
  return s;
}

Tensor Input(const Shape& s, uint32_t seed) {
  return ToDevice(GetBackend("cpu"), testing::RandomDistinct(static_cast<size_t>(s.numel()), seed),
                  s);
}

TEST(LayerGradCheckTest, ConvReluMaxPoolFlattenLinear) {
  auto m = Build(
      {L("conv2d", 4, 3, 1, 1), L("relu"), L("maxpool", 0, 2, 2), L("flatten"), L("linear", 3)},
      Shape{2, 6, 6}, 2);
  CheckWithRandomProjection(*m, Input(Shape{2, 2, 6, 6}, 1));
}

TEST(LayerGradCheckTest, StridedConvAndAvgPool) {
  auto m = Build({L("conv2d", 3, 3, 2, 1), L("avgpool", 0, 2, 1, 1), L("flatten"), L("linear", 2)},
                 Shape{3, 7, 5}, 3);
  CheckWithRandomProjection(*m, Input(Shape{3, 3, 7, 5}, 2));
}

TEST(LayerGradCheckTest, BatchNormInTraining) {
  auto m = Build({L("conv2d", 3, 3, 1, 1), L("batchnorm"), L("relu"), L("flatten"), L("linear", 4),
                  L("batchnorm")},
                 Shape{2, 4, 4}, 4);
  // Batch norm moves every output of a channel when one weight moves, so many ReLU inputs
  // shift at once: a small step keeps finite differences away from the kinks.
  CheckWithRandomProjection(*m, Input(Shape{4, 2, 4, 4}, 3), 1e-3f);
}

TEST(LayerGradCheckTest, DropoutWithFixedMask) {
  LayerSpec d = L("dropout");
  d.p = 0.3;
  auto m = Build({L("flatten"), L("linear", 8), d, L("linear", 3)}, Shape{1, 3, 3}, 3);
  CheckWithRandomProjection(*m, Input(Shape{3, 1, 3, 3}, 4));
}

// A residual block with a projection shortcut (as in ResNet-8's downsampling blocks) and one with
// an identity shortcut, as graph nodes, without the ReLUs whose kinks make finite differences
// through batch norm unreliable; ReLU, batch norm and pooling are checked on their own above.
// The stem's output is read twice (fan-out: its gradient is the sum of both readers').
TEST(LayerGradCheckTest, ResidualWithProjectionShortcut) {
  Backend& be = GetBackend("cpu");
  auto g = std::make_unique<Graph>(be);
  const int stem = g->Add(std::make_unique<Conv2d>(be, "stem", 2, 3, 1, 1, true));
  g->Add(std::make_unique<Conv2d>(be, "block.conv1", 4, 3, 2, 1, false));
  g->Add(std::make_unique<BatchNorm>(be, "block.bn1"));
  const int main = g->Add(std::make_unique<Conv2d>(be, "block.conv2", 4, 3, 1, 1, false));
  g->Add(std::make_unique<Conv2d>(be, "block.shortcut.0", 4, 1, 2, 0, false), {stem});
  const int sc = g->Add(std::make_unique<BatchNorm>(be, "block.shortcut.1"));
  const int block = g->Add(std::make_unique<Add>(be, "block.add"), {main, sc});
  g->Add(std::make_unique<Add>(be, "identity"), {block, block});
  g->Add(std::make_unique<Flatten>(be, ""));
  g->Add(std::make_unique<Linear>(be, "fc", 3, true));
  Model m(be, std::move(g), Shape{2, 6, 6});
  m.Setup(3, Precision::kF32);
  m.InitParams(12);
  std::vector<std::string> names;
  for (const auto& p : m.named_params()) names.push_back(p.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"stem.weight", "stem.bias", "block.conv1.weight",
                                      "block.bn1.weight", "block.bn1.bias", "block.conv2.weight",
                                      "block.shortcut.0.weight", "block.shortcut.1.weight",
                                      "block.shortcut.1.bias", "fc.weight", "fc.bias"}));
  CheckWithRandomProjection(m, Input(Shape{3, 2, 6, 6}, 5), 1e-3f);
}

// A MobileNet-style block: a depthwise (dilated) conv, a grouped 1x1 conv, the smooth
// activations, and a squeeze-and-excitation scaling (global pool, 1x1 convs, hard sigmoid, a
// per-channel Mul with the scale as its first input, as torchvision exports it), then a same-
// shape Mul (hard swish written as x * hardsigmoid(x)).
TEST(LayerGradCheckTest, DepthwiseGroupedConvActivationsAndSqueezeExcitation) {
  Backend& be = GetBackend("cpu");
  using K = ew::ActKind;
  auto g = std::make_unique<Graph>(be);
  g->Add(std::make_unique<Conv2d>(be, "stem", 4, 3, 1, 1, true));
  g->Add(std::make_unique<Conv2d>(be, "dw", 4, 3, 1, 2, false, /*groups=*/4, /*dilation=*/2));
  const int act = g->Add(std::make_unique<Activation>(be, "", ew::Activation{K::kHardSwish}));
  g->Add(std::make_unique<Pool2d>(be, "", PoolKind::kAvg, 0, 0, 0));
  g->Add(std::make_unique<Conv2d>(be, "se.fc1", 2, 1, 1, 0, true));
  g->Add(std::make_unique<Activation>(be, "", ew::Activation{K::kTanh}));
  g->Add(std::make_unique<Conv2d>(be, "se.fc2", 4, 1, 1, 0, true));
  const int scale = g->Add(
      std::make_unique<Activation>(be, "", ew::Activation{K::kHardSigmoid, 1.f / 6.f, 0.5f}));
  const int se = g->Add(std::make_unique<Mul>(be, "se.mul"), {scale, act});
  g->Add(std::make_unique<Conv2d>(be, "project", 4, 1, 1, 0, false, /*groups=*/2));
  const int sig = g->Add(std::make_unique<Activation>(be, "", ew::Activation{K::kSigmoid}));
  g->Add(std::make_unique<Mul>(be, "gate"), {sig, se});
  g->Add(std::make_unique<Flatten>(be, ""));
  g->Add(std::make_unique<Linear>(be, "fc", 3, true));
  Model m(be, std::move(g), Shape{2, 6, 6});
  m.Setup(3, Precision::kF32);
  m.InitParams(13);
  CheckWithRandomProjection(m, Input(Shape{3, 2, 6, 6}, 6), 1e-3f);
}

// Zero padding that differs between sides (as the ONNX import puts before a conv with uneven
// pads), a per-channel shift (Add of an (N, C, 1, 1) tensor), a ceil-mode average that leaves
// the padding out of its divisor, and a ceil-mode max pool.
TEST(LayerGradCheckTest, PadChannelAddAndCeilModePools) {
  Backend& be = GetBackend("cpu");
  auto g = std::make_unique<Graph>(be);
  g->Add(std::make_unique<Pad2d>(be, "", 0, 1, 2, 1));                              // 6x6 -> 8x8
  const int conv = g->Add(std::make_unique<Conv2d>(be, "conv", 3, 3, 1, 0, true));  // 6x6
  g->Add(std::make_unique<Pool2d>(be, "", PoolKind::kAvg, 0, 0, 0));
  const int shift = g->Add(std::make_unique<Conv2d>(be, "shift", 3, 1, 1, 0, true));
  g->Add(std::make_unique<Add>(be, "add"), {shift, conv});
  g->Add(std::make_unique<Pool2d>(be, "", PoolKind::kAvg, 3, 2, 1, /*ceil_mode=*/true,
                                  /*count_include_pad=*/false));                          // 4x4
  g->Add(std::make_unique<Pool2d>(be, "", PoolKind::kMax, 3, 2, 0, /*ceil_mode=*/true));  // 2x2
  g->Add(std::make_unique<Flatten>(be, ""));
  g->Add(std::make_unique<Linear>(be, "fc", 3, true));
  Model m(be, std::move(g), Shape{2, 6, 6});
  m.Setup(3, Precision::kF32);
  EXPECT_EQ(m.net().output_shape(5), (Shape{3, 3, 4, 4}));
  EXPECT_EQ(m.net().output_shape(6), (Shape{3, 3, 2, 2}));
  m.InitParams(17);
  CheckWithRandomProjection(m, Input(Shape{3, 2, 6, 6}, 8), 1e-3f);
}

// model.layers as a graph: a dense-style block (concat of a conv and its input) and a residual
// sum, written with `inputs` as a user would in TOML.
TEST(LayerGradCheckTest, LayersWithInputsFormAGraph) {
  std::vector<LayerSpec> specs = {L("conv2d", 3, 3, 1, 1),
                                  L("conv2d", 2, 3, 1, 1),
                                  L("concat"),
                                  L("conv2d", 5, 1),
                                  L("add"),
                                  L("flatten"),
                                  L("linear", 3)};
  specs[0].name = "stem";
  specs[1].name = "grow";
  specs[2].inputs = {"stem", "grow"};
  specs[2].name = "cat";
  specs[3].name = "mix";
  specs[4].inputs = {"cat", "mix"};
  auto m = Build(specs, Shape{2, 5, 5}, 3);
  EXPECT_EQ(m->output_shape(), (Shape{3, 3}));
  CheckWithRandomProjection(*m, Input(Shape{3, 2, 5, 5}, 7));
}

TEST(LayerGradCheckTest, SoftmaxCrossEntropyLoss) {
  Backend& be = GetBackend("cpu");
  auto m = Build({L("flatten"), L("linear", 5), L("relu"), L("linear", 4)}, Shape{6}, 3);
  Loss loss(be, LossKind::kCrossEntropy, m->output_shape());
  Tensor labels = testing::ToDeviceI32(be, {3, 0, 2}, Shape{3});
  auto f = [&](const Tensor& y) {
    loss.Forward(y, labels);
    return testing::ScalarToHost(be, loss.loss_sum()) / 3.0;
  };
  auto df = [&](const Tensor& y) {
    loss.Forward(y, labels);
    return loss.Backward(y, labels, 3);
  };
  CheckParamGrads(*m, Input(Shape{3, 6}, 6), f, df);
}

TEST(LayerGradCheckTest, MseLoss) {
  Backend& be = GetBackend("cpu");
  auto m = Build({L("linear", 2)}, Shape{5}, 4);
  Loss loss(be, LossKind::kMse, m->output_shape());
  Tensor t = ToDevice(be, RandomUniform(8, 7), Shape{4, 2});
  auto f = [&](const Tensor& y) {
    loss.Forward(y, t);
    return testing::ScalarToHost(be, loss.loss_sum()) / 8.0;  // mean over every element
  };
  auto df = [&](const Tensor& y) { return loss.Backward(y, t, 4); };
  CheckParamGrads(*m, Input(Shape{4, 5}, 8), f, df);
}

TEST(LayerGradCheckTest, AccumulateAddsMicroStepGradients) {
  Backend& be = GetBackend("cpu");
  auto m = Build({L("conv2d", 2, 3, 1, 1), L("batchnorm"), L("flatten"), L("linear", 2)},
                 Shape{1, 4, 4}, 2);
  ForwardContext ctx;
  ctx.training = true;
  Tensor xa = Input(Shape{2, 1, 4, 4}, 9), xb = Input(Shape{2, 1, 4, 4}, 10);
  Tensor dy = ToDevice(be, RandomUniform(4, 11), Shape{2, 2});
  m->Forward(xa, ctx);
  m->Backward(dy, false);
  const auto ga = ToHost(be, m->grads());
  m->Forward(xb, ctx);
  m->Backward(dy, false);
  const auto gb = ToHost(be, m->grads());
  m->Forward(xa, ctx);
  m->Backward(dy, false);
  m->Forward(xb, ctx);
  m->Backward(dy, true);
  const auto gsum = ToHost(be, m->grads());
  for (size_t i = 0; i < gsum.size(); ++i) EXPECT_NEAR(gsum[i], ga[i] + gb[i], 1e-5) << i;
}

}  // namespace
}  // namespace dptrain
