// SPDX-License-Identifier: Apache-2.0
// Model graph: canonical names and PyTorch shapes, the reverse flat layout, gradient readiness
// reporting, zoo models and the config layer builder.
#include "models/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <ostream>
#include <tuple>

#include "core/backend_registry.h"
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
#include "models/zoo/zoo.h"
#include "tests/testing/backends.h"
#include "tests/testing/tolerances.h"

namespace dptrain {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::map<std::string, Shape> ParamShapes(const Model& m) {
  std::map<std::string, Shape> out;
  for (const auto& p : m.named_params()) out[p.name] = p.tensor.shape();
  return out;
}

TEST(ModelTest, RefCnnHasCanonicalNamesAndPytorchShapes) {
  Backend& be = GetBackend("cpu");
  Model m(be, BuildZooModel(be, "ref_cnn", 10), Shape{1, 28, 28});
  m.Setup(4, Precision::kF32);
  const std::map<std::string, Shape> want = {
      {"conv1.weight", Shape{32, 1, 3, 3}},  {"conv1.bias", Shape{32}},
      {"conv2.weight", Shape{64, 32, 3, 3}}, {"conv2.bias", Shape{64}},
      {"fc1.weight", Shape{128, 3136}},      {"fc1.bias", Shape{128}},
      {"fc2.weight", Shape{10, 128}},        {"fc2.bias", Shape{10}}};
  EXPECT_EQ(ParamShapes(m), want);
  EXPECT_EQ(m.num_params(), 32 * 9 + 32 + 64 * 32 * 9 + 64 + 128 * 3136 + 128 + 1280 + 10);
  EXPECT_EQ(m.output_shape(), (Shape{4, 10}));
  for (const auto& p : m.named_params()) EXPECT_EQ(p.name.rfind("module.", 0), std::string::npos);
}

TEST(ModelTest, ParametersAreLaidOutLastLayerFirst) {
  Backend& be = GetBackend("cpu");
  Model m(be, BuildZooModel(be, "ref_cnn", 10), Shape{1, 28, 28});
  m.Setup(2, Precision::kF32);
  std::map<std::string, int64_t> off;
  for (const auto& p : m.named_params()) off[p.name] = p.offset;
  EXPECT_EQ(off["fc2.bias"], 0);
  EXPECT_LT(off["fc2.bias"], off["fc2.weight"]);
  EXPECT_LT(off["fc2.weight"], off["fc1.bias"]);
  EXPECT_LT(off["fc1.weight"], off["conv2.bias"]);
  EXPECT_LT(off["conv2.weight"], off["conv1.bias"]);
  EXPECT_LT(off["conv1.bias"], off["conv1.weight"]);
  for (const auto& p : m.named_params()) EXPECT_EQ(p.offset % 16, 0) << p.name;
  // Views alias the flat buffers.
  for (const auto& p : m.named_params()) {
    EXPECT_EQ(p.tensor.raw(), static_cast<char*>(m.params().raw()) + p.offset * 4);
  }
}

// dist.shard's layout: groups of whole layers, in backward order, each padded to a multiple of
// world x 16 floats, covering the buffer; without flat gradients, BindGroupGrads points every
// gradient of a group into the buffer it is given, at its offset within the group.
TEST(ModelTest, ShardedLayoutGroupsWholeLayersPaddedToChunks) {
  Backend& be = GetBackend("cpu");
  Model m(be, BuildZooModel(be, "ref_cnn", 10), Shape{1, 28, 28});
  FlatLayout layout;
  layout.group_multiple = 3 * 16;
  layout.first_group_floats = 1000;  // fc2 (1290 floats) alone
  layout.group_floats = 1;           // then one layer per group
  layout.flat_grads = false;
  m.Setup(2, Precision::kF32, layout);
  EXPECT_FALSE(m.grads().defined());
  const auto& g = m.groups();
  ASSERT_EQ(g.size(), 4u);  // fc2, fc1, conv2, conv1
  int64_t at = 0;
  for (const auto& [begin, end] : g) {
    EXPECT_EQ(begin, at);
    EXPECT_EQ((end - begin) % 48, 0);
    at = end;
  }
  EXPECT_EQ(at, m.params().numel());
  std::map<std::string, int64_t> off;
  for (const auto& p : m.named_params()) off[p.name] = p.offset;
  EXPECT_EQ(off["fc1.bias"], g[1].first);  // the next group starts on its boundary
  const auto children = m.net().size();
  EXPECT_EQ(m.group_of_child(children - 1), 0);  // fc2
  EXPECT_EQ(m.group_of_child(0), 3);             // conv1
  Tensor scratch = be.Zeros(Shape{g[0].second - g[0].first}, DType::kF32, "test");
  m.BindGroupGrads(0, scratch);
  auto* fc2 = &m.net().layer(children - 1);
  std::vector<ParamRef> refs;
  fc2->ListParams(&refs);
  for (const auto& r : refs) {
    EXPECT_GE(r.grad->raw(), scratch.raw());
    EXPECT_LT(r.grad->raw(), static_cast<char*>(scratch.raw()) + scratch.bytes());
  }
  m.BindGroupGrads(0, Tensor());
  for (const auto& r : refs) EXPECT_FALSE(r.grad->defined());
}

TEST(ModelTest, BackwardReportsReadyGradientsInOrder) {
  Backend& be = GetBackend("cpu");
  Model m(be, BuildZooModel(be, "ref_cnn", 10), Shape{1, 28, 28});
  m.Setup(2, Precision::kF32);
  m.InitParams(1);
  Tensor x = testing::ToDevice(be, testing::RandomUniform(2 * 784, 3), Shape{2, 1, 28, 28});
  ForwardContext ctx;
  ctx.training = true;
  const Tensor& y = m.Forward(x, ctx);
  Tensor dy =
      testing::ToDevice(be, testing::RandomUniform(static_cast<size_t>(y.numel()), 4), y.shape());
  std::vector<int64_t> ready;
  m.Backward(dy, false, [&](int64_t n) { ready.push_back(n); });
  ASSERT_FALSE(ready.empty());
  EXPECT_TRUE(std::is_sorted(ready.begin(), ready.end()));
  EXPECT_EQ(ready.back(), m.grads().numel());
  // After the first reported point, fc2's gradients are final.
  std::map<std::string, int64_t> end;
  for (const auto& p : m.named_params()) end[p.name] = p.offset + p.tensor.numel();
  EXPECT_GE(ready.front(), end["fc2.weight"]);
  EXPECT_LT(ready.front(), end["conv1.weight"]);
}

// train.profile's rows: every op a graph node runs is recorded under the node's name (forward and
// backward, the residual sums included); ops outside the graph under "".
TEST(ModelTest, ProfileNamesTheGraphNodeOfEachOp) {
  Backend& be = GetBackend("cpu");
  Model m(be, BuildZooModel(be, "resnet8", 10), Shape{3, 32, 32});
  m.Setup(2, Precision::kF32);
  m.InitParams(1);
  Tensor x = testing::ToDevice(be, testing::RandomUniform(2 * 3 * 32 * 32, 3), Shape{2, 3, 32, 32});
  ForwardContext ctx;
  ctx.training = true;
  be.ResetProfile();
  be.EnableProfiling(true);
  const Tensor& y = m.Forward(x, ctx);
  Tensor dy =
      testing::ToDevice(be, testing::RandomUniform(static_cast<size_t>(y.numel()), 4), y.shape());
  m.Backward(dy, false);
  Tensor z = be.Empty(y.shape(), DType::kF32, "z");
  be.ReluForward(y, &z);  // outside the graph
  be.EnableProfiling(false);
  std::map<std::pair<std::string, std::string>, int64_t> calls;
  std::map<std::pair<std::string, std::string>, double> flops;
  for (const OpStat& s : be.Profile()) {
    calls[{s.node, s.name}] += s.calls;
    flops[{s.node, s.name}] += s.flops;
  }
  be.ResetProfile();
  EXPECT_EQ((calls[{"conv1", "conv2d_fwd"}]), 1);
  EXPECT_EQ((calls[{"conv1", "conv2d_bwd_weights"}]), 1);
  EXPECT_EQ((calls[{"layer1.0.bn1", "batchnorm_fwd"}]), 1);
  EXPECT_EQ((calls[{"layer1.0.bn1", "batchnorm_bwd"}]), 1);
  EXPECT_EQ((calls[{"fc", "linear_fwd"}]), 1);
  EXPECT_EQ((calls[{"", "relu_fwd"}]), 1);
  // 2 flops per multiply-add: conv1 (3 -> 16, 3x3) at 32x32 and fc (64 -> 10), 2 samples.
  EXPECT_DOUBLE_EQ((flops[{"conv1", "conv2d_fwd"}]), 2.0 * 2 * (16 * 3 * 3 * 3) * (32 * 32));
  EXPECT_DOUBLE_EQ((flops[{"conv1", "conv2d_bwd_weights"}]), 2.0 * 2 * (16 * 3 * 3 * 3) * 1024);
  EXPECT_DOUBLE_EQ((flops[{"fc", "linear_fwd"}]), 2.0 * 2 * 64 * 10);
  EXPECT_EQ((flops[{"layer1.0.bn1", "batchnorm_fwd"}]), 0.0) << "counted for conv and linear only";
  for (const auto& [key, n] : calls) {
    const bool mine = key.second == "relu_fwd" || key.second.rfind("copy", 0) == 0;  // the test's
    EXPECT_FALSE(key.first.empty() && !mine) << key.second << " ran outside any graph node";
  }
}

// The graph folds each ReLU that alone reads a batch norm, a convolution or a residual sum into
// it (resnet8: the stem's and each block's first, after batch norms, and each block's last, after
// the sum. ref_cnn: both convolutions' ReLUs; fc1's stays): two training steps give bit for bit the
// unfolded model's outputs, gradients and running statistics, and evaluation its outputs, with less
// activation memory (each folded ReLU held an output and an input gradient). In bf16 too, where
// the layers that alone read a convolution's output (each batch norm; ref_cnn's 2x2 pools) write
// its gradient in bf16 (Conv2dFusion::dy_bf16): 2 bytes an element less again. And a block input
// that a convolution and the shortcut read has its two gradients added by the backward of the
// layer the ReLU is folded into (the stem's batch norm, the previous block's sum), as it reads
// them: no gradient-sum buffer, and still the same numbers. The batch norms that only a residual
// sum reads leave their normalisation to the sum: no output either.
struct FoldCase {
  const char* model;
  Shape sample;
  int folded;
  int64_t floats_saved_per_sample;
  int64_t bf16_gradients_per_sample;  // elements of the convolutions' outputs
  // elements of the batch norms' outputs that only a convolution reads (through the folded
  // ReLU): written in bf16 for it (BatchNormArgs::y_bf16)
  int64_t bf16_outputs_per_sample = 0;
  // elements of the outputs two layers read whose gradient the folded layer's backward takes in
  // two parts (LayerFlow::sums_gradient_parts): no gradient-sum buffer
  int64_t sums_in_parts_per_sample = 0;
  // elements of the batch norms' outputs that a residual sum alone reads: the sum applies them
  // (BatchNormFusion::deferred), no output held
  int64_t applied_by_sums_per_sample = 0;
  // elements of the residual sums' outputs that only bf16 convolutions read: in bf16 written so,
  // with their gradient in a buffer of its own (AddFusion::y_bf16): 2 bytes more each
  int64_t bf16_sums_per_sample = 0;
  // elements of the strided shortcuts' input gradients that they hand the sum that reads them
  // sampled (Conv2dDesc::dx_sub): not held
  int64_t sampled_grads_per_sample = 0;
};
void PrintTo(const FoldCase& c, std::ostream* os) { *os << c.model; }

// Two training steps (random inputs, backward from a random dy) and an evaluation forward on
// `m`, set up for `batch`: each output, every parameter gradient after each step, the buffers.
std::vector<std::vector<float>> TwoStepsAndEval(Backend& be, Model& m, const Shape& batch) {
  std::vector<std::vector<float>> seen;
  ForwardContext ctx;
  ctx.training = true;
  for (int step = 0; step < 2; ++step) {
    Tensor x = testing::ToDevice(
        be, testing::RandomUniform(static_cast<size_t>(batch.numel()), 10 + step), batch);
    const Tensor& y = m.Forward(x, ctx);
    seen.push_back(testing::ToHost(be, y));
    Tensor dy = testing::ToDevice(
        be, testing::RandomUniform(static_cast<size_t>(y.numel()), 20 + step), y.shape());
    m.Backward(dy, false);
    for (const auto& g : m.named_grads()) seen.push_back(testing::ToHost(be, g.tensor));
  }
  for (const auto& b : m.named_buffers()) seen.push_back(testing::ToHost(be, b.tensor));
  ctx.training = false;
  Tensor x =
      testing::ToDevice(be, testing::RandomUniform(static_cast<size_t>(batch.numel()), 30), batch);
  seen.push_back(testing::ToHost(be, m.Forward(x, ctx)));
  return seen;
}

class FoldingTest : public ::testing::TestWithParam<FoldCase> {};

TEST_P(FoldingTest, FoldingReluChangesNoNumber) {
  const FoldCase& fc = GetParam();
  Backend& be = GetBackend("cpu");
  for (const Precision prec : {Precision::kF32, Precision::kBF16}) {
    if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, prec})) continue;
    SCOPED_TRACE(PrecisionName(prec));
    const int64_t n = 4;
    std::vector<int64_t> dims{n};
    dims.insert(dims.end(), fc.sample.dims().begin(), fc.sample.dims().end());
    const Shape batch(dims);
    const auto train = [&](bool fold, int* folded, int64_t* activation_bytes) {
      auto net = BuildZooModel(be, fc.model, 10);
      net->set_fold(fold);
      net->set_fuse_conv_pool(false);     // sums in another order (ConvPoolFusionTest)
      net->set_share_input_grads(false);  // counts each layer's own buffers
      Model m(be, std::move(net), fc.sample);
      m.Setup(n, prec);
      m.InitParams(1);
      *folded = 0;
      for (size_t i = 0; i < m.net().size(); ++i) {
        const auto* relu = dynamic_cast<const Relu*>(&m.net().layer(i));
        *folded += relu != nullptr && relu->folded();
      }
      *activation_bytes = m.net().ActivationBytesPerSample();
      return TwoStepsAndEval(be, m, batch);
    };
    int folded = 0, unfolded = 0;
    int64_t bytes_folded = 0, bytes_unfolded = 0;
    const auto want = train(false, &unfolded, &bytes_unfolded);
    const auto got = train(true, &folded, &bytes_folded);
    EXPECT_EQ(unfolded, 0);
    EXPECT_EQ(folded, fc.folded);
    EXPECT_EQ(got, want);
    EXPECT_EQ(
        bytes_unfolded - bytes_folded,
        4 * (2 * fc.floats_saved_per_sample + fc.sums_in_parts_per_sample +
             fc.applied_by_sums_per_sample) +
            4 * fc.sampled_grads_per_sample +
            (prec == Precision::kBF16 ? 2 * (fc.bf16_gradients_per_sample +
                                             fc.bf16_outputs_per_sample - fc.bf16_sums_per_sample)
                                      : 0));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, FoldingTest,
    ::testing::Values(FoldCase{"resnet8", Shape{3, 32, 32}, 7,
                               16 * 32 * 32 * 2 + 32 * 16 * 16 + 64 * 8 * 8 +  // after batch norms
                                   16 * 32 * 32 + 32 * 16 * 16 + 64 * 8 * 8,   // after the sums
                               // every batch norm's input: 3 per stage (a shortcut's in 2 and 3)
                               3 * (16 * 32 * 32 + 32 * 16 * 16 + 64 * 8 * 8),
                               // each block's first batch norm, read by its second convolution
                               16 * 32 * 32 + 32 * 16 * 16 + 64 * 8 * 8,
                               // the input of each block but the last stage's (whose output only
                               // the pool reads)
                               16 * 32 * 32 + 16 * 32 * 32 + 32 * 16 * 16,
                               // each block's second batch norm, and the shortcuts'
                               16 * 32 * 32 + 2 * (32 * 16 * 16 + 64 * 8 * 8),
                               // the sums of the first two blocks
                               16 * 32 * 32 + 32 * 16 * 16,
                               // the two shortcuts' input gradients but every fourth pixel
                               (16 * 32 * 32 + 32 * 16 * 16) * 3 / 4},
                      FoldCase{"ref_cnn", Shape{1, 28, 28}, 2, 32 * 28 * 28 + 64 * 14 * 14,
                               32 * 28 * 28 + 64 * 14 * 14}),
    [](const ::testing::TestParamInfo<FoldCase>& p) { return std::string(p.param.model); });

// One model.layers entry: type, out (channels or features), kernel, stride, pad.
LayerSpec layer(std::string type, int64_t out = 0, int64_t kernel = 0, int64_t stride = 0,
                int64_t pad = 0) {
  LayerSpec s;
  s.type = std::move(type), s.out = out, s.kernel = kernel, s.stride = stride, s.pad = pad;
  return s;
}

// A max pool that alone reads a ReLU's output gates its pooled gradient itself, and the ReLU (a
// convolution's or a batch norm's folded one, or a ReLU layer after a layer that cannot fold it)
// skips its gate: the same numbers as the unfolded model, no relu_bwd pass left, and a ReLU
// layer without its input-gradient buffer. In bf16 a 2x2 pool after a convolution's folded ReLU
// also writes its input gradient in bf16, as the convolution's backward reads it (the rounding it
// applied to the f32 gradient before): still the same numbers, 2 bytes an element less.
TEST(ReluGateTest, MaxPoolTakesOverTheReluGate) {
  Backend& be = GetBackend("cpu");
  for (const Precision prec : {Precision::kF32, Precision::kBF16}) {
    if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, prec})) continue;
    const std::vector<std::pair<const char*, std::vector<LayerSpec>>> stacks = {
        {"conv, relu, maxpool 2",
         {layer("conv2d", 4, 3, 1, 1), layer("relu"), layer("maxpool", 0, 2)}},
        {"conv, batchnorm, relu, maxpool 3/2 pad 1 (the ImageNet stem)",
         {layer("conv2d", 4, 3, 1, 1), layer("batchnorm"), layer("relu"),
          layer("maxpool", 0, 3, 2, 1)}},
        {"conv, avgpool, relu, maxpool 2 (a ReLU layer)",
         {layer("conv2d", 4, 3, 1, 1), layer("avgpool", 0, 2), layer("relu"),
          layer("maxpool", 0, 2)}},
    };
    const Shape sample{2, 12, 12}, batch{3, 2, 12, 12};
    for (const auto& [what, specs] : stacks) {
      SCOPED_TRACE(std::string(what) + " " + PrecisionName(prec));
      std::vector<LayerSpec> all = specs;
      all.push_back(layer("flatten"));
      all.push_back(layer("linear", 3));
      // relu_bwd calls per graph node
      const auto train = [&](bool fold, std::map<std::string, int64_t>* relu_bwd, int64_t* bytes) {
        auto net = BuildFromLayers(be, all);
        net->set_fold(fold);
        net->set_fuse_conv_pool(false);     // the first stack would fuse (ConvPoolFusionTest)
        net->set_share_input_grads(false);  // counts each layer's own buffers
        Model m(be, std::move(net), sample);
        m.Setup(batch[0], prec);
        m.InitParams(3);
        *bytes = m.net().ActivationBytesPerSample();
        be.ResetProfile();
        be.EnableProfiling(true);
        auto seen = TwoStepsAndEval(be, m, batch);
        be.EnableProfiling(false);
        for (const OpStat& st : be.Profile()) {
          if (st.name == "relu_bwd") (*relu_bwd)[st.node] += st.calls;
        }
        be.ResetProfile();
        return seen;
      };
      std::map<std::string, int64_t> gates_unfolded, gates_folded;
      int64_t bytes_unfolded = 0, bytes_folded = 0;
      const auto want = train(false, &gates_unfolded, &bytes_unfolded);
      const auto got = train(true, &gates_folded, &bytes_folded);
      EXPECT_EQ(got, want);
      // Layers are named by their index: the ReLU's gate once per training step, then the pool's.
      const std::string relu = std::to_string(specs.size() - 2),
                        pool = std::to_string(specs.size() - 1);
      EXPECT_EQ(gates_unfolded, (std::map<std::string, int64_t>{{relu, 2}}));
      EXPECT_EQ(gates_folded, (std::map<std::string, int64_t>{{pool, 2}}));
      EXPECT_LT(bytes_folded, bytes_unfolded);
      if (specs[0].type == "conv2d" && specs[1].type == "relu" && specs[2].kernel == 2) {
        // the ReLU's output and input gradient (4 channels, 12 x 12, f32), and in bf16 half the
        // pool's input gradient
        const int64_t elements = 4 * 12 * 12;
        EXPECT_EQ(bytes_unfolded - bytes_folded, (prec == Precision::kBF16 ? 10 : 8) * elements);
      }
    }
  }
}

// A first convolution, its ReLU and a 2x2 max pool run as one op on the CPU backend
// (ConvPoolDesc): ref_cnn's conv1 and a 3-channel stack built from layers, in fp32 and bf16, give
// the two-op model's outputs, gradients and evaluation up to the rounding of a different
// summation order, with the same parameter names, no conv2d or pool op left for them in the
// profile, and without the convolution's full-size output among the activations. A convolution
// whose input gradient is wanted (not the first layer) or a 3x3 pool stays two ops.
TEST(ConvPoolFusionTest, FirstConvReluAndPoolRunAsOneOp) {
  Backend& be = GetBackend("cpu");
  struct Case {
    const char* what;
    std::vector<LayerSpec> layers;  // empty: ref_cnn
    Shape sample;
    std::string conv, pool;  // the fused pair's node names; empty: none fuses
  };
  const std::vector<Case> cases = {
      {"ref_cnn", {}, Shape{1, 28, 28}, "conv1", "maxpool #2"},
      {"rgb, odd size",
       {layer("conv2d", 20, 5, 1, 2), layer("relu"), layer("maxpool", 0, 2), layer("flatten"),
        layer("linear", 3)},
       Shape{3, 11, 9},
       "0",
       "2"},
      {"second conv (input gradient wanted)",
       {layer("conv2d", 4, 3, 1, 1), layer("relu"), layer("conv2d", 4, 3, 1, 1), layer("relu"),
        layer("maxpool", 0, 2), layer("flatten"), layer("linear", 3)},
       Shape{2, 8, 8},
       "",
       ""},
      {"3x3 pool",
       {layer("conv2d", 4, 3, 1, 1), layer("relu"), layer("maxpool", 0, 3, 2, 1), layer("flatten"),
        layer("linear", 3)},
       Shape{2, 8, 8},
       "",
       ""},
  };
  for (const Precision prec : {Precision::kF32, Precision::kBF16}) {
    if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, prec})) continue;
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.what) + " " + PrecisionName(prec));
      std::vector<int64_t> dims{3};
      dims.insert(dims.end(), c.sample.dims().begin(), c.sample.dims().end());
      const Shape batch(dims);
      const auto train = [&](bool fuse, std::map<std::pair<std::string, std::string>, int64_t>* ops,
                             int64_t* bytes, std::vector<std::string>* names) {
        auto net =
            c.layers.empty() ? BuildZooModel(be, "ref_cnn", 10) : BuildFromLayers(be, c.layers);
        net->set_fuse_conv_pool(fuse);
        Model m(be, std::move(net), c.sample);
        m.Setup(batch[0], prec);
        m.InitParams(5);
        *bytes = m.net().ActivationBytesPerSample();
        for (const auto& p : m.named_params()) names->push_back(p.name);
        be.ResetProfile();
        be.EnableProfiling(true);
        auto seen = TwoStepsAndEval(be, m, batch);
        be.EnableProfiling(false);
        for (const OpStat& st : be.Profile()) (*ops)[{st.node, st.name}] += st.calls;
        be.ResetProfile();
        return seen;
      };
      std::map<std::pair<std::string, std::string>, int64_t> ops_two, ops_fused;
      int64_t bytes_two = 0, bytes_fused = 0;
      std::vector<std::string> names_two, names_fused;
      const auto want = train(false, &ops_two, &bytes_two, &names_two);
      const auto got = train(true, &ops_fused, &bytes_fused, &names_fused);
      EXPECT_EQ(names_fused, names_two);
      ASSERT_EQ(got.size(), want.size());
      const testing::Tolerance tol =
          prec == Precision::kF32 ? testing::kCrossBackendTol : testing::kBF16Tol;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(testing::AllClose(got[i], testing::ToDouble(want[i]), tol)) << "tensor " << i;
      }
      if (c.conv.empty()) {
        EXPECT_EQ(ops_fused, ops_two) << "nothing fuses";
        EXPECT_EQ(bytes_fused, bytes_two);
        continue;
      }
      EXPECT_EQ((ops_fused[{c.pool, "conv_pool_fwd"}]), 3) << "2 training steps, 1 evaluation";
      EXPECT_EQ((ops_fused[{c.pool, "conv_pool_bwd"}]), 2);
      EXPECT_EQ((ops_two[{c.conv, "conv2d_fwd"}]), 3);
      for (const auto& [key, n] : ops_fused) {
        EXPECT_TRUE(key.first != c.conv &&
                    (key.first != c.pool || key.second.rfind("conv_pool", 0) == 0))
            << key.first << " " << key.second << " ran " << n << " times";
      }
      EXPECT_LT(bytes_fused, bytes_two);
    }
  }
}

// Channels-last activations (Graph::set_channels_last, on where the backend prefers them: the
// CPU backend) change no number beyond the rounding of a different summation order: two
// training steps' outputs, gradients and buffers, and an evaluation, against all-NCHW.
struct LayoutCase {
  const char* model;
  Shape sample;
  std::vector<std::string> nhwc;  // nodes whose output is NHWC
  std::vector<std::string> nchw;  // and some that stay NCHW
};

std::unique_ptr<Graph> BuildLayoutModel(Backend& be, const std::string& name) {
  if (name != "broadcast_add") return BuildZooModel(be, name, 10);
  // A sum broadcasting a global pool's (N, C, 1, 1) over its input refuses NHWC at Setup: the
  // graph plans again with it (and so the convolution feeding it) on NCHW.
  auto g = std::make_unique<Graph>(be);
  g->Add(std::make_unique<Conv2d>(be, "conv", 8, 3, 1, 1, true));
  g->Add(std::make_unique<Pool2d>(be, "pool", PoolKind::kAvg, 0, 0, 0));
  g->Add(std::make_unique<Add>(be, "sum"), {0, 1});
  g->Add(std::make_unique<Conv2d>(be, "conv2", 8, 3, 2, 1, false));
  g->Add(std::make_unique<Pool2d>(be, "pool2", PoolKind::kAvg, 0, 0, 0));
  g->Add(std::make_unique<Flatten>(be, "flat"));
  g->Add(std::make_unique<Linear>(be, "fc", 10, true));
  return g;
}

class ChannelsLastTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(ChannelsLastTest, ChangesNoNumberBeyondRounding) {
  const LayoutCase& lc = GetParam();
  Backend& be = GetBackend("cpu");
  ASSERT_TRUE(be.PrefersChannelsLast());
  const int64_t n = 4;
  std::vector<int64_t> dims{n};
  dims.insert(dims.end(), lc.sample.dims().begin(), lc.sample.dims().end());
  const Shape batch(dims);
  const auto train = [&](bool channels_last, std::map<std::string, bool>* layout) {
    auto net = BuildLayoutModel(be, lc.model);
    net->set_channels_last(channels_last);
    Model m(be, std::move(net), lc.sample);
    m.Setup(n, Precision::kF32);
    m.InitParams(1);
    for (size_t i = 0; i < m.net().size(); ++i) {
      const std::string& name = m.net().node_name(i);
      (*layout)[name.empty() ? m.net().layer(i).type() + " #" + std::to_string(i) : name] =
          m.net().output_nhwc(i);
    }
    return TwoStepsAndEval(be, m, batch);
  };
  std::map<std::string, bool> off, on;
  const auto want = train(false, &off);
  const auto got = train(true, &on);
  for (const auto& [name, nhwc] : off) EXPECT_FALSE(nhwc) << name;
  for (const auto& name : lc.nhwc) EXPECT_TRUE(on.at(name)) << name;
  for (const auto& name : lc.nchw) EXPECT_FALSE(on.at(name)) << name;
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < want.size(); ++t) {
    ASSERT_EQ(got[t].size(), want[t].size());
    float scale = 0.f;
    for (float v : want[t]) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < want[t].size(); ++i) {
      ASSERT_NEAR(got[t][i], want[t][i], 1e-4f * std::max(scale, 1.f))
          << "tensor " << t << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, ChannelsLastTest,
    ::testing::Values(
        LayoutCase{
            "resnet8",
            Shape{3, 32, 32},
            // avgpool's (N, C, 1, 1) is the same bytes in both layouts.
            {"conv1", "bn1", "layer1.0.conv1", "layer2.0.shortcut.1", "layer3.0.add", "avgpool"},
            {"flatten", "fc"}},
        // conv2's pool reads it channels-last and writes its 7 x 7 maps in NCHW, the linear
        // layer's order, for the flatten, which then only views them (PoolDesc::y_nchw).
        LayoutCase{"ref_cnn",
                   Shape{1, 28, 28},
                   {"conv1", "maxpool #2", "conv2"},
                   {"maxpool #5", "flatten #6", "fc1"}},
        LayoutCase{"broadcast_add", Shape{3, 8, 8}, {"conv2"}, {"conv", "pool", "sum", "fc"}}),
    [](const ::testing::TestParamInfo<LayoutCase>& p) { return std::string(p.param.model); });

// Every kind of join and pass-through in one graph: a residual sum whose gradient goes to two
// readers, one of them an output read twice (a gradient sum); a squeeze-and-excitation product;
// a concat; a dropout; a ReLU whose gate the max pool takes over; a flatten and a reshape that are
// views of their gradient.
std::unique_ptr<Graph> BuildEveryJoin(Backend& be) {
  auto g = std::make_unique<Graph>(be);
  g->Add(std::make_unique<Conv2d>(be, "a", 8, 3, 1, 1, false));         // 0
  g->Add(std::make_unique<BatchNorm>(be, "bn"));                        // 1
  g->Add(std::make_unique<Relu>(be, "relu"));                           // 2 (folded into bn)
  g->Add(std::make_unique<Conv2d>(be, "b", 8, 3, 1, 1, true));          // 3
  g->Add(std::make_unique<Add>(be, "sum"), {3, 2});                     // 4
  g->Add(std::make_unique<Pool2d>(be, "se", PoolKind::kAvg, 0, 0, 0));  // 5 (global)
  g->Add(std::make_unique<Activation>(be, "gate", ew::Activation{ew::ActKind::kSigmoid}));
  g->Add(std::make_unique<Mul>(be, "scale"), {4, 6});                   // 7
  g->Add(std::make_unique<Concat>(be, "cat"), {7, 2});                  // 8
  g->Add(std::make_unique<Dropout>(be, "drop", 0.25f));                 // 9
  g->Add(std::make_unique<Relu>(be, "relu2"));                          // 10 (a layer: gate handed)
  g->Add(std::make_unique<Pool2d>(be, "mp", PoolKind::kMax, 2, 2, 0));  // 11
  g->Add(std::make_unique<Flatten>(be, "flat"));                        // 12
  g->Add(std::make_unique<Reshape>(be, "rs", std::vector<int64_t>{-1}));
  g->Add(std::make_unique<Linear>(be, "fc", 10, true));
  return g;
}

// An output read by three layers far apart: its gradient sum is written at the middle reader's
// backward and read at its producer's, while other input gradients come and go in between.
std::unique_ptr<Graph> BuildThreeReaders(Backend& be) {
  auto g = std::make_unique<Graph>(be);
  g->Add(std::make_unique<Conv2d>(be, "x", 8, 3, 1, 1, true));       // 0: read by 1, 3, 5
  g->Add(std::make_unique<Conv2d>(be, "p", 8, 3, 1, 1, true), {0});  // 1
  g->Add(std::make_unique<Conv2d>(be, "q", 8, 3, 1, 1, true), {1});  // 2
  g->Add(std::make_unique<Conv2d>(be, "r", 8, 3, 1, 1, true), {0});  // 3
  g->Add(std::make_unique<Add>(be, "s1"), {2, 3});                   // 4
  g->Add(std::make_unique<Add>(be, "s2"), {4, 0});                   // 5
  g->Add(std::make_unique<Pool2d>(be, "gap", PoolKind::kAvg, 0, 0, 0));
  g->Add(std::make_unique<Flatten>(be, "flat"));
  g->Add(std::make_unique<Linear>(be, "fc", 10, true));
  return g;
}

// Residual sums with a folded ReLU (which hand their inputs the gradient in their output buffer)
// whose inputs pass it on: a sum without a ReLU, and a batch norm's folded ReLU read by the sum
// alone. With activation recompute that buffer must outlive the segments in between.
std::unique_ptr<Graph> BuildAddReluChain(Backend& be) {
  auto g = std::make_unique<Graph>(be);
  g->Add(std::make_unique<Conv2d>(be, "a", 8, 3, 1, 1, false));       // 0
  g->Add(std::make_unique<BatchNorm>(be, "bn_a"));                    // 1
  g->Add(std::make_unique<Relu>(be, "r1"));                           // 2 (folded, 1 reader)
  g->Add(std::make_unique<Conv2d>(be, "b", 8, 3, 1, 1, false), {0});  // 3
  g->Add(std::make_unique<BatchNorm>(be, "bn_b"));                    // 4
  g->Add(std::make_unique<Add>(be, "sum1"), {2, 4});                  // 5 (passes dy on)
  g->Add(std::make_unique<Conv2d>(be, "c", 8, 3, 1, 1, true), {0});   // 6
  g->Add(std::make_unique<Add>(be, "sum2"), {5, 6});                  // 7
  g->Add(std::make_unique<Relu>(be, "r2"));                           // 8 (folded into sum2)
  g->Add(std::make_unique<Pool2d>(be, "gap", PoolKind::kAvg, 0, 0, 0));
  g->Add(std::make_unique<Flatten>(be, "flat"));
  g->Add(std::make_unique<Linear>(be, "fc", 10, true));
  return g;
}

// Outputs read by two layers whose gradient the reading layer takes in two parts
// (LayerFlow::sums_gradient_parts): a batch norm's folded ReLU read by a convolution and by a sum
// that passes its gradient on (that part is the sum's own gradient sum, read by a convolution too),
// and a residual sum's folded ReLU read by a convolution and the next residual sum (that part in
// the sum's output buffer), the next sum's folded ReLU read by the pool alone.
std::unique_ptr<Graph> BuildGradientParts(Backend& be) {
  auto g = std::make_unique<Graph>(be);
  g->Add(std::make_unique<Conv2d>(be, "a", 8, 3, 1, 1, false));       // 0
  g->Add(std::make_unique<BatchNorm>(be, "bn"));                      // 1
  g->Add(std::make_unique<Relu>(be, "r1"));                           // 2 (folded): read by 3, 5
  g->Add(std::make_unique<Conv2d>(be, "b", 8, 3, 1, 1, false), {2});  // 3
  g->Add(std::make_unique<BatchNorm>(be, "bn_b"));                    // 4
  g->Add(std::make_unique<Add>(be, "s1"), {4, 2});                    // 5: read by 6, 7
  g->Add(std::make_unique<Conv2d>(be, "c", 8, 3, 1, 1, true), {5});   // 6
  g->Add(std::make_unique<Add>(be, "s2"), {5, 6});                    // 7
  g->Add(std::make_unique<Relu>(be, "r2"));                           // 8 (folded): read by 9, 10
  g->Add(std::make_unique<Conv2d>(be, "d", 8, 3, 1, 1, true), {8});   // 9
  g->Add(std::make_unique<Add>(be, "s3"), {9, 8});                    // 10
  g->Add(std::make_unique<Relu>(be, "r3"));                           // 11 (folded)
  g->Add(std::make_unique<Pool2d>(be, "gap", PoolKind::kAvg, 0, 0, 0));
  g->Add(std::make_unique<Flatten>(be, "flat"));
  g->Add(std::make_unique<Linear>(be, "fc", 10, true));
  return g;
}

// An output's two gradients taken in parts by the layer that reads their sum change no number
// against summing them first (Graph::set_sum_gradient_parts), with input gradients shared or not
// and with activation recompute cut every one, two, three nodes or not at all, on resnet8 and on
// the graphs above; and the graph holds the sums' bytes less.
TEST(GradientPartsTest, ChangeNoNumberAndHoldLess) {
  Backend& be = GetBackend("cpu");
  const std::vector<std::pair<std::string, Shape>> models = {{"resnet8", Shape{3, 32, 32}},
                                                             {"gradient_parts", Shape{3, 8, 8}},
                                                             {"add_relu_chain", Shape{3, 8, 8}}};
  for (const Precision prec : {Precision::kF32, Precision::kBF16}) {
    if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, prec})) continue;
    for (const auto& model : models) {
      const std::string& name = model.first;
      const Shape& sample = model.second;
      std::vector<int64_t> dims{4};
      dims.insert(dims.end(), sample.dims().begin(), sample.dims().end());
      for (const bool share : {true, false}) {
        for (const size_t every : {0, 1, 2, 3}) {
          SCOPED_TRACE(::testing::Message()
                       << name << " " << PrecisionName(prec) << (share ? " shared" : " own")
                       << " cut every " << every << " nodes");
          const auto train = [&](bool parts, int64_t* sum_bytes) {
            auto net = name == "gradient_parts"   ? BuildGradientParts(be)
                       : name == "add_relu_chain" ? BuildAddReluChain(be)
                                                  : BuildZooModel(be, name, 10);
            net->set_sum_gradient_parts(parts);
            net->set_share_input_grads(share);
            net->set_recompute(every > 0, every);
            Model m(be, std::move(net), sample);
            m.Setup(6, prec);  // a micro-batch below the Setup batch
            m.InitParams(5);
            *sum_bytes = 0;
            for (size_t i = 0; i < m.net().size(); ++i) {
              *sum_bytes += m.net().GradSumBytesPerSample(i);
            }
            return TwoStepsAndEval(be, m, Shape(dims));
          };
          int64_t summed = 0, in_parts = 0;
          const auto want = train(false, &summed);
          const auto got = train(true, &in_parts);
          ASSERT_EQ(got.size(), want.size());
          for (size_t t = 0; t < want.size(); ++t) EXPECT_EQ(got[t], want[t]) << "tensor " << t;
          if (!share && name != "add_relu_chain") {
            EXPECT_LT(in_parts, summed);
          }
        }
      }
    }
  }
}

// resnet8's strided shortcuts (channels-last, fp32 and bf16) hand their input gradient sampled to
// the residual sum that adds it as it reads it (LayerFlow::input_grad_stride, Conv2dDesc::dx_sub):
// a quarter of the bytes. Not with the parts summed first, nor NCHW. The numbers are those of
// summing first (ChangeNoNumberAndHoldLess).
TEST(GradientPartsTest, StridedShortcutsHandTheirGradientSampled) {
  Backend& be = GetBackend("cpu");
  if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, Precision::kBF16})) {
    GTEST_SKIP() << "no bf16 on this CPU";
  }
  const auto sampled = [&](Precision prec, bool parts, bool channels_last, int64_t* bytes) {
    auto net = BuildZooModel(be, "resnet8", 10);
    net->set_sum_gradient_parts(parts);
    net->set_channels_last(channels_last);
    net->set_share_input_grads(false);
    Model m(be, std::move(net), Shape{3, 32, 32});
    m.Setup(4, prec);
    std::vector<std::string> labels;
    *bytes = 0;  // the shortcuts' own
    for (size_t i = 0; i < m.net().size(); ++i) {
      const Layer& l = m.net().layer(i);
      if (l.flow().input_grad_stride != 1)
        labels.push_back(l.label() + "/" + std::to_string(l.flow().input_grad_stride));
      if (l.label().find(".shortcut.0") != std::string::npos)
        *bytes += l.ActivationBytesPerSample();
    }
    return labels;
  };
  for (const Precision prec : {Precision::kF32, Precision::kBF16}) {
    SCOPED_TRACE(PrecisionName(prec));
    int64_t with = 0, without = 0, unused = 0;
    EXPECT_EQ(sampled(prec, true, true, &with),
              (std::vector<std::string>{"layer2.0.shortcut.0/2", "layer3.0.shortcut.0/2"}));
    EXPECT_TRUE(sampled(prec, false, true, &without).empty()) << "summed first";
    // the two shortcuts' input gradients, f32: (16, 32, 32) and (32, 16, 16), 3/4 of each
    EXPECT_EQ(without - with, 4 * 3 * (16 * 32 * 32 + 32 * 16 * 16) / 4);
    EXPECT_TRUE(sampled(prec, true, false, &unused).empty()) << "NCHW";
  }
}

// Batch norms that only a sum reads, where the sum can and cannot apply them: one reading the
// graph's input (no input gradient: it keeps its output), one as a sum's input 1 (applied), and
// one summed with a per-channel tensor (a broadcast sum, which runs NCHW: it keeps its output).
std::unique_ptr<Graph> BuildBatchNormsIntoSums(Backend& be) {
  auto g = std::make_unique<Graph>(be);
  g->Add(std::make_unique<BatchNorm>(be, "bn_in"), {Graph::kInput});             // 0
  g->Add(std::make_unique<Conv2d>(be, "a", 3, 3, 1, 1, true), {Graph::kInput});  // 1
  g->Add(std::make_unique<Add>(be, "s0"), {1, 0});                               // 2
  g->Add(std::make_unique<Conv2d>(be, "b", 8, 3, 1, 1, false), {2});             // 3
  g->Add(std::make_unique<BatchNorm>(be, "bn_b"));                               // 4
  g->Add(std::make_unique<Conv2d>(be, "c", 8, 3, 1, 1, true), {2});              // 5
  g->Add(std::make_unique<Add>(be, "s1"), {5, 4});                               // 6
  // A convolution between: it writes NCHW for the broadcast sum and reads s1 channels-last.
  g->Add(std::make_unique<Conv2d>(be, "d", 8, 3, 1, 1, true), {6});          // 7
  g->Add(std::make_unique<BatchNorm>(be, "bn_c"), {7});                      // 8
  g->Add(std::make_unique<Pool2d>(be, "se", PoolKind::kAvg, 0, 0, 0), {7});  // 9 (global)
  g->Add(std::make_unique<Add>(be, "s2"), {8, 9});                           // 10
  g->Add(std::make_unique<Pool2d>(be, "gap", PoolKind::kAvg, 0, 0, 0));
  g->Add(std::make_unique<Flatten>(be, "flat"));
  g->Add(std::make_unique<Linear>(be, "fc", 10, true));
  return g;
}

// A batch norm applied by the sum that alone reads it (BatchNormFusion::deferred) changes no
// number against the model without any folding, with input gradients shared or not and with
// activation recompute cut every one or two nodes or not at all, where it applies (resnet8's
// second batch norms and shortcuts; a batch norm as a sum's input 1) and where it does not.
TEST(DeferredBatchNormTest, ChangesNoNumber) {
  Backend& be = GetBackend("cpu");
  const std::vector<std::tuple<std::string, Shape, int>> models = {
      {"resnet8", Shape{3, 32, 32}, 5},
      {"add_relu_chain", Shape{3, 8, 8}, 1},
      {"bn_into_sums", Shape{3, 8, 8}, 1}};
  for (const Precision prec : {Precision::kF32, Precision::kBF16}) {
    if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, prec})) continue;
    for (const auto& [name, sample, applied] : models) {
      std::vector<int64_t> dims{4};
      dims.insert(dims.end(), sample.dims().begin(), sample.dims().end());
      for (const bool share : {true, false}) {
        for (const size_t every : {0, 1, 2}) {
          SCOPED_TRACE(::testing::Message()
                       << name << " " << PrecisionName(prec) << (share ? " shared" : " own")
                       << " cut every " << every << " nodes");
          const auto train = [&, &name = name, &sample = sample](bool fold, int* deferred) {
            auto net = name == "bn_into_sums"     ? BuildBatchNormsIntoSums(be)
                       : name == "add_relu_chain" ? BuildAddReluChain(be)
                                                  : BuildZooModel(be, name, 10);
            net->set_fold(fold);
            net->set_share_input_grads(share);
            net->set_recompute(every > 0, every);
            Model m(be, std::move(net), sample);
            m.Setup(6, prec);
            m.InitParams(7);
            *deferred = 0;
            for (size_t i = 0; i < m.net().size(); ++i) {
              const auto* bn = dynamic_cast<const BatchNorm*>(&m.net().layer(i));
              *deferred += bn != nullptr && bn->deferred_affine() != nullptr;
            }
            return TwoStepsAndEval(be, m, Shape(dims));
          };
          int none = 0, deferred = 0;
          const auto want = train(false, &none);
          const auto got = train(true, &deferred);
          EXPECT_EQ(none, 0);
          EXPECT_EQ(deferred, applied);
          ASSERT_EQ(got.size(), want.size());
          for (size_t t = 0; t < want.size(); ++t) EXPECT_EQ(got[t], want[t]) << "tensor " << t;
        }
      }
    }
  }
}

// In bf16 every convolution whose output only a batch norm reads writes it in bf16
// (Conv2dDesc::y_bf16; resnet8: all nine), with folding or without (a precision, not a fusion),
// channels-last only; and the evaluation after two steps stays within bf16's reach of fp32's.
TEST(Bf16ConvOutputTest, ResNetConvolutionsHandTheirBatchNormsBf16) {
  Backend& be = GetBackend("cpu");
  if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, Precision::kBF16})) {
    GTEST_SKIP() << "no bf16 on this CPU";
  }
  const Shape sample{3, 32, 32};
  const auto run = [&](Precision prec, bool fold, bool channels_last, int* bf16_outputs) {
    auto net = BuildZooModel(be, "resnet8", 10);
    net->set_fold(fold);
    net->set_channels_last(channels_last);
    Model m(be, std::move(net), sample);
    m.Setup(4, prec);
    m.InitParams(3);
    *bf16_outputs = 0;
    for (size_t i = 0; i < m.net().size(); ++i) {
      const auto* conv = dynamic_cast<const Conv2d*>(&m.net().layer(i));
      *bf16_outputs += conv != nullptr && conv->writes_bf16_output();
    }
    return TwoStepsAndEval(be, m, Shape{4, 3, 32, 32});
  };
  int count = 0;
  for (const bool fold : {true, false}) {
    run(Precision::kBF16, fold, true, &count);
    EXPECT_EQ(count, 9) << (fold ? "folded" : "unfolded");
  }
  run(Precision::kBF16, true, false, &count);
  EXPECT_EQ(count, 0) << "NCHW";
  const auto f32 = run(Precision::kF32, true, true, &count);
  EXPECT_EQ(count, 0) << "fp32";
  const auto bf16 = run(Precision::kBF16, true, true, &count);
  ASSERT_EQ(bf16.size(), f32.size());
  // the last tensor: the evaluation's logits after two steps
  std::vector<double> ref(f32.back().begin(), f32.back().end());
  EXPECT_TRUE(testing::AllClose(bf16.back(), ref, 0.1, 0.05));
}

// In bf16 a residual sum whose output only bf16 convolutions read writes it in bf16 (resnet8:
// the first two blocks' sums, read by the next block's convolution and shortcut; not the last,
// which the pool reads), where it applies a deferred batch norm: channels-last, with folding (the
// ReLU after the sum is folded into it), and not in fp32. FoldingTest, RecomputeTest and
// GradientPartsTest check that the numbers are those of the model without it.
TEST(Bf16SumOutputTest, BlockOutputsReadByConvolutionsAreBf16) {
  Backend& be = GetBackend("cpu");
  if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, Precision::kBF16})) {
    GTEST_SKIP() << "no bf16 on this CPU";
  }
  const auto count = [&](Precision prec, bool fold, bool channels_last) {
    auto net = BuildZooModel(be, "resnet8", 10);
    net->set_fold(fold);
    net->set_channels_last(channels_last);
    Model m(be, std::move(net), Shape{3, 32, 32});
    m.Setup(4, prec);
    int sums = 0;
    for (size_t i = 0; i < m.net().size(); ++i) {
      const auto* add = dynamic_cast<const Add*>(&m.net().layer(i));
      if (add == nullptr || !add->writes_bf16_output()) continue;
      ++sums;
      // its gated gradient (f32), which both inputs get, lies in the shared input-gradient buffer
      const Shape& out = m.net().output_shape(i);
      EXPECT_EQ(m.net().SharedInputGradBytesPerSample(i), 4 * out.numel() / out[0])
          << m.net().layer(i).label();
    }
    return sums;
  };
  EXPECT_EQ(count(Precision::kBF16, true, true), 2);
  EXPECT_EQ(count(Precision::kBF16, false, true), 0) << "unfolded";
  EXPECT_EQ(count(Precision::kBF16, true, false), 0) << "NCHW";
  EXPECT_EQ(count(Precision::kF32, true, true), 0) << "fp32";
}

// Input gradients in one shared buffer (Graph::set_share_input_grads) change no number, on the
// zoo's plain and residual networks and on every join; and the graph holds fewer bytes.
TEST(InputGradSharingTest, ChangesNoNumberAndHoldsLess) {
  Backend& be = GetBackend("cpu");
  const std::vector<std::pair<std::string, Shape>> models = {{"ref_cnn", Shape{1, 28, 28}},
                                                             {"resnet8", Shape{3, 32, 32}},
                                                             {"mlp", Shape{1, 28, 28}},
                                                             {"every_join", Shape{3, 8, 8}},
                                                             {"three_readers", Shape{3, 8, 8}}};
  for (const Precision prec : {Precision::kF32, Precision::kBF16}) {
    if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, prec})) continue;
    for (const auto& model : models) {
      // Not a structured binding: the lambda below captures these, which clang 14 refuses.
      const std::string& name = model.first;
      const Shape& sample = model.second;
      SCOPED_TRACE(::testing::Message() << name << " " << PrecisionName(prec));
      const int64_t n = 4;
      std::vector<int64_t> dims{n};
      dims.insert(dims.end(), sample.dims().begin(), sample.dims().end());
      const auto train = [&](bool share, int64_t* bytes) {
        auto net = name == "every_join"      ? BuildEveryJoin(be)
                   : name == "three_readers" ? BuildThreeReaders(be)
                                             : BuildZooModel(be, name, 10);
        net->set_share_input_grads(share);
        Model m(be, std::move(net), sample);
        m.Setup(n, prec);
        m.InitParams(5);
        *bytes = m.net().ActivationBytesPerSample();
        if (!share) {
          EXPECT_EQ(m.net().InputGradBytesPerSample(), 0);
        }
        return TwoStepsAndEval(be, m, Shape(dims));
      };
      int64_t own = 0, shared = 0;
      const auto want = train(false, &own);
      const auto got = train(true, &shared);
      EXPECT_EQ(got, want);
      EXPECT_LT(shared, own);
    }
  }
}

// A chain of equal layers needs two input gradients at a time (the one being read and the one
// being written), however long it is: the shared buffer is two of them.
TEST(InputGradSharingTest, AChainNeedsTwoBuffers) {
  Backend& be = GetBackend("cpu");
  for (const int depth : {3, 8}) {
    auto g = std::make_unique<Graph>(be);
    for (int i = 0; i < depth; ++i)
      g->Add(std::make_unique<Conv2d>(be, std::string("c").append(std::to_string(i)), 8, 3, 1, 1,
                                      true));
    g->Add(std::make_unique<Flatten>(be, "flat"));
    g->Add(std::make_unique<Linear>(be, "fc", 10, true));
    Model m(be, std::move(g), Shape{8, 8, 8});
    m.Setup(4, Precision::kF32);
    // Each convolution but the first (its input is the model's) and the linear layer write an
    // input gradient of 8 x 8 x 8 floats; the flatten passes the linear one's on as a view.
    EXPECT_EQ(m.net().InputGradBytesPerSample(), 2 * 4 * 8 * 8 * 8) << depth << " convolutions";
  }
}

// A layer that returns its input as its output and hands back the gradient it was given, and
// says so only for the gradient when told to (LayerFlow::passes_gradient; never
// forward_passes_input).
class Sneaky final : public Layer {
 public:
  Sneaky(Backend& be, bool declares_gradient)
      : Layer(be, "sneaky"), declares_gradient_(declares_gradient) {}
  std::string type() const override { return "sneaky"; }
  Shape Setup(const Shape& in, const SetupOptions& /*opts*/) override {
    flow_.passes_gradient = declares_gradient_;
    return in;
  }
  const Tensor& Forward(const Tensor& x, const ForwardContext& /*ctx*/) override { return x; }
  const Tensor& Backward(const Tensor& dy, bool /*accumulate*/) override { return dy; }

 private:
  bool declares_gradient_;
};

// Two convolutions, a Sneaky, a flatten and a linear layer, set up for batches of 2 x (2, 6, 6).
std::unique_ptr<Model> SneakyModel(Backend& be, bool declares_gradient, size_t recompute_every) {
  auto g = std::make_unique<Graph>(be);
  g->Add(std::make_unique<Conv2d>(be, "c0", 4, 3, 1, 1, true));
  g->Add(std::make_unique<Conv2d>(be, "c1", 4, 3, 1, 1, true));
  g->Add(std::make_unique<Sneaky>(be, declares_gradient));
  g->Add(std::make_unique<Flatten>(be, "flat"));
  g->Add(std::make_unique<Linear>(be, "fc", 3, true));
  g->set_recompute(recompute_every > 0, recompute_every);
  auto m = std::make_unique<Model>(be, std::move(g), Shape{2, 6, 6});
  m->Setup(2, Precision::kF32);
  m->InitParams(1);
  return m;
}

// A layer that hands back the gradient it was given without saying so (LayerFlow::passes_gradient)
// would have its buffer reused while an earlier layer still reads it: the graph refuses.
TEST(InputGradSharingTest, AnUndeclaredPassThroughIsCaught) {
  Backend& be = GetBackend("cpu");
  const auto m = SneakyModel(be, /*declares_gradient=*/false, /*recompute_every=*/0);
  ForwardContext ctx;
  ctx.training = true;
  Tensor x = testing::ToDevice(be, testing::RandomUniform(2 * 2 * 6 * 6, 1), Shape{2, 2, 6, 6});
  const Tensor& y = m->Forward(x, ctx);
  Tensor dy =
      testing::ToDevice(be, testing::RandomUniform(static_cast<size_t>(y.numel()), 2), y.shape());
  EXPECT_THAT([&] { m->Backward(dy, false); },
              ThrowsMessage<InternalError>(HasSubstr("layer 'sneaky' returned the gradient")));
}

// Activation recompute (Graph::set_recompute) changes no number: outputs, gradients, batch-norm
// running statistics (a forward run again leaves them) and an evaluation, two steps, on the zoo's
// plain and residual networks and on every join and pass-through, with the graph cut every node,
// every two, every three nodes and where it holds the fewest bytes; a micro-batch below the
// Setup batch.
TEST(RecomputeTest, ChangesNoNumber) {
  Backend& be = GetBackend("cpu");
  const std::vector<std::pair<std::string, Shape>> models = {
      {"ref_cnn", Shape{1, 28, 28}},     {"resnet8", Shape{3, 32, 32}},
      {"mlp", Shape{1, 28, 28}},         {"every_join", Shape{3, 8, 8}},
      {"three_readers", Shape{3, 8, 8}}, {"add_relu_chain", Shape{3, 8, 8}}};
  for (const Precision prec : {Precision::kF32, Precision::kBF16}) {
    if (!be.Supports(Conv2dDesc{1, 1, 1, 1, 1, 1, 1, 1, 0, true, prec})) continue;
    for (const auto& model : models) {
      const std::string& name = model.first;
      const Shape& sample = model.second;
      const int64_t n = 4;
      std::vector<int64_t> dims{n};
      dims.insert(dims.end(), sample.dims().begin(), sample.dims().end());
      const auto train = [&](bool recompute, size_t every, size_t* segments) {
        auto net = name == "every_join"       ? BuildEveryJoin(be)
                   : name == "three_readers"  ? BuildThreeReaders(be)
                   : name == "add_relu_chain" ? BuildAddReluChain(be)
                                              : BuildZooModel(be, name, 10);
        net->set_recompute(recompute, every);
        Model m(be, std::move(net), sample);
        m.Setup(n + 2, prec);
        m.InitParams(5);
        *segments = m.net().recompute_segments();
        return TwoStepsAndEval(be, m, Shape(dims));
      };
      size_t segments = 0;
      const auto want = train(false, 0, &segments);
      EXPECT_EQ(segments, 1u);
      for (const size_t every : {0, 1, 2, 3}) {
        SCOPED_TRACE(::testing::Message()
                     << name << " " << PrecisionName(prec) << " cut every " << every << " nodes");
        const auto got = train(true, every, &segments);
        if (every == 1) {
          EXPECT_GT(segments, 4u);
        }
        ASSERT_EQ(got.size(), want.size());
        for (size_t t = 0; t < want.size(); ++t) EXPECT_EQ(got[t], want[t]) << "tensor " << t;
      }
    }
  }
}

// Where it chooses the cut, recompute holds much less: resnet8's outputs in a few segments.
TEST(RecomputeTest, HoldsLess) {
  Backend& be = GetBackend("cpu");
  for (const std::string name : {"resnet8", "resnet18_cifar", "ref_cnn"}) {
    const Shape sample = name == "ref_cnn" ? Shape{1, 28, 28} : Shape{3, 32, 32};
    const auto bytes = [&](bool recompute, size_t* segments) {
      auto net = BuildZooModel(be, name, 10);
      net->set_recompute(recompute);
      Model m(be, std::move(net), sample);
      m.Setup(8, Precision::kF32);
      *segments = m.net().recompute_segments();
      return m.net().ActivationBytesPerSample();
    };
    size_t segments = 0;
    const int64_t all = bytes(false, &segments);
    const int64_t less = bytes(true, &segments);
    std::printf("%s: %lld -> %lld bytes a sample, %zu segments\n", name.c_str(),
                static_cast<long long>(all), static_cast<long long>(less), segments);
    EXPECT_GT(segments, 1u) << name;
    EXPECT_LT(less, all) << name;
  }
}

// A layer that returns its input as its output without saying so
// (LayerFlow::forward_passes_input)
// would have its readers read a buffer another segment writes over: the graph refuses.
TEST(RecomputeTest, AnUndeclaredForwardPassThroughIsCaught) {
  Backend& be = GetBackend("cpu");
  const auto m = SneakyModel(be, /*declares_gradient=*/true, /*recompute_every=*/1);
  ForwardContext ctx;
  ctx.training = true;
  Tensor x = testing::ToDevice(be, testing::RandomUniform(2 * 2 * 6 * 6, 1), Shape{2, 2, 6, 6});
  EXPECT_THAT([&] { m->Forward(x, ctx); },
              ThrowsMessage<InternalError>(HasSubstr("layer 'sneaky' returned its output")));
}

TEST(ModelTest, CifarNetComputesFlattenSizeFromInput) {
  Backend& be = GetBackend("cpu");
  Model m(be, BuildZooModel(be, "cifar_net", 10), Shape{3, 32, 32});
  m.Setup(2, Precision::kF32);
  EXPECT_EQ(ParamShapes(m).at("fc1.weight"), (Shape{10, 64 * 16 * 16}));
  Model small(be, BuildZooModel(be, "cifar_net", 10), Shape{3, 16, 16});
  small.Setup(2, Precision::kF32);
  EXPECT_EQ(ParamShapes(small).at("fc1.weight"), (Shape{10, 64 * 8 * 8}));
}

TEST(ModelTest, ResNet8NamesFollowTorchvision) {
  Backend& be = GetBackend("cpu");
  Model m(be, BuildZooModel(be, "resnet8", 10), Shape{3, 32, 32});
  m.Setup(2, Precision::kF32);
  const auto shapes = ParamShapes(m);
  EXPECT_EQ(shapes.at("conv1.weight"), (Shape{16, 3, 3, 3}));
  EXPECT_EQ(shapes.at("layer1.0.conv1.weight"), (Shape{16, 16, 3, 3}));
  EXPECT_EQ(shapes.at("layer2.0.conv1.weight"), (Shape{32, 16, 3, 3}));
  EXPECT_EQ(shapes.at("layer2.0.shortcut.0.weight"), (Shape{32, 16, 1, 1}));
  EXPECT_EQ(shapes.at("layer3.0.bn2.weight"), (Shape{64}));
  EXPECT_EQ(shapes.at("fc.weight"), (Shape{10, 64}));
  EXPECT_EQ(shapes.count("layer1.0.shortcut.0.weight"), 0u);
  std::vector<std::string> buffers;
  for (const auto& b : m.named_buffers()) buffers.push_back(b.name);
  EXPECT_THAT(buffers, ::testing::Contains("layer2.0.shortcut.1.running_var"));
  EXPECT_EQ(m.output_shape(), (Shape{2, 10}));
}

TEST(ModelTest, LayersFromConfigUseSequentialIndexNames) {
  Backend& be = GetBackend("cpu");
  std::vector<LayerSpec> specs(4);
  specs[0].type = "flatten";
  specs[1].type = "linear";
  specs[1].out = 7;
  specs[2].type = "relu";
  specs[3].type = "linear";
  specs[3].out = 3;
  specs[3].name = "head";
  Model m(be, BuildFromLayers(be, specs), Shape{2, 3, 3});
  m.Setup(5, Precision::kF32);
  const auto shapes = ParamShapes(m);
  EXPECT_EQ(shapes.at("1.weight"), (Shape{7, 18}));
  EXPECT_EQ(shapes.at("head.weight"), (Shape{3, 7}));
  EXPECT_EQ(m.output_shape(), (Shape{5, 3}));
}

// Pools from model.layers take the stride written (an explicit 1 as well), the kernel's when
// none is: (2, 3, 8, 8) through a 3x3 stride-1 pad-1 average pool keeps 8x8, through a default
// max pool (2x2, stride 2) becomes 4x4, through a 2x2 stride-1 one 7x7.
TEST(ModelTest, LayersFromConfigPoolsTakeTheStrideWritten) {
  Backend& be = GetBackend("cpu");
  auto out_hw = [&](const char* type, int64_t kernel, int64_t stride, int64_t pad) {
    std::vector<LayerSpec> specs(1);
    specs[0].type = type;
    specs[0].kernel = kernel;
    specs[0].stride = stride;
    specs[0].pad = pad;
    Model m(be, BuildFromLayers(be, specs), Shape{3, 8, 8});
    m.Setup(2, Precision::kF32);
    return m.output_shape()[2];
  };
  EXPECT_EQ(out_hw("avgpool", 3, 1, 1), 8);
  EXPECT_EQ(out_hw("maxpool", 2, 2, 0), 4);
  EXPECT_EQ(out_hw("maxpool", 2, 1, 0), 7);
}

// torchvision's resnet18 / resnet50 with num_classes=10: the same parameter count and names
// (torchvision.models.resnet18(num_classes=10): 11,181,642; resnet50: 23,528,522 parameters).
TEST(ModelTest, ZooResNetsMatchTorchvision) {
  Backend& be = GetBackend("cpu");
  struct Want {
    const char* name;
    int64_t params;
    size_t tensors, buffers;
  };
  for (const Want& w : {Want{"resnet18", 11181642, 62, 40}, Want{"resnet50", 23528522, 161, 106},
                        Want{"resnet18_cifar", 11173962, 62, 40}}) {
    SCOPED_TRACE(w.name);
    Model m(be, BuildZooModel(be, w.name, 10), Shape{3, 32, 32});
    m.Setup(2, Precision::kF32);
    EXPECT_EQ(m.num_params(), w.params);
    EXPECT_EQ(m.named_params().size(), w.tensors);
    EXPECT_EQ(m.named_buffers().size(), w.buffers);
    EXPECT_EQ(m.output_shape(), (Shape{2, 10}));
    const auto shapes = ParamShapes(m);
    EXPECT_EQ(shapes.count("layer2.0.downsample.0.weight"), 1u);
    EXPECT_EQ(shapes.count("layer4.1.bn2.bias"), 1u);
  }
}

// A graph whose layer output nobody reads is a config error naming the layer; so are sums of
// different shapes.
TEST(ModelTest, GraphErrorsNameTheLayer) {
  Backend& be = GetBackend("cpu");
  {
    auto g = std::make_unique<Graph>(be);
    g->Add(std::make_unique<Linear>(be, "dangling", 4, true));
    g->Add(std::make_unique<Linear>(be, "head", 3, true), {Graph::kInput});
    Model m(be, std::move(g), Shape{5});
    EXPECT_THAT(
        [&] { m.Setup(2, Precision::kF32); },
        ThrowsMessage<ConfigError>(HasSubstr("layer 'dangling': no layer reads its output")));
  }
  {
    auto g = std::make_unique<Graph>(be);
    const int a = g->Add(std::make_unique<Linear>(be, "a", 4, true));
    const int b = g->Add(std::make_unique<Linear>(be, "b", 3, true), {Graph::kInput});
    g->Add(std::make_unique<Add>(be, "sum"), {a, b});
    Model m(be, std::move(g), Shape{5});
    EXPECT_THAT([&] { m.Setup(2, Precision::kF32); },
                ThrowsMessage<ConfigError>(HasSubstr(
                    "layer 'sum' (add): input 1 has shape [2, 3] but input 0 has [2, 4]")));
  }
}

TEST(ModelTest, UnknownZooNameListsKnownOnes) {
  Backend& be = GetBackend("cpu");
  try {
    BuildZooModel(be, "resnet34", 10);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.name: unknown model 'resnet34'"));
    EXPECT_THAT(e.what(), HasSubstr("ref_cnn"));
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(ModelTest, LinearWithoutFlattenSaysSo) {
  Backend& be = GetBackend("cpu");
  std::vector<LayerSpec> specs(1);
  specs[0].type = "linear";
  specs[0].out = 3;
  Model m(be, BuildFromLayers(be, specs), Shape{1, 4, 4});
  try {
    m.Setup(2, Precision::kF32);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("flatten"));
  }
}

TEST(ModelTest, InitIsDeterministicAndFanInBounded) {
  Backend& be = GetBackend("cpu");
  Model a(be, BuildZooModel(be, "ref_cnn", 10), Shape{1, 28, 28});
  Model b(be, BuildZooModel(be, "ref_cnn", 10), Shape{1, 28, 28});
  a.Setup(1, Precision::kF32);
  b.Setup(1, Precision::kF32);
  a.InitParams(7);
  b.InitParams(7);
  EXPECT_EQ(testing::ToHost(be, a.params()), testing::ToHost(be, b.params()));
  for (const auto& p : a.named_params()) {
    if (p.name != "fc1.weight") continue;
    const auto v = testing::ToHost(be, p.tensor);
    const float bound = 1.f / std::sqrt(3136.f);
    float mx = 0;
    for (float f : v) mx = std::max(mx, std::abs(f));
    EXPECT_LE(mx, bound);
    EXPECT_GT(mx, 0.9f * bound);
  }
}

}  // namespace
}  // namespace dptrain
