// SPDX-License-Identifier: Apache-2.0
// Config model.layers: parsing with defaults, the ToToml round trip, arrays of tables, and layer
// errors that name the layer, the key and the line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "launcher/config.h"
#include "tests/unit/config_test_util.h"

namespace dptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// ------------------------------------------------------------------------------------------
// model.layers

constexpr char kLayers[] = R"([model]
classes = 10
layers = [
  {type = "conv2d", name = "conv1", out = 32, kernel = 3, pad = 1},
  {type = "relu"},
  {type = "maxpool"},
  {type = "avgpool", kernel = 3, stride = 1, pad = 1},
  {type = "batchnorm"},
  {type = "dropout", p = 0.25},
  {type = "flatten"},
  {type = "linear", name = "fc", out = 10, bias = false},
]
[data]
train = "synthetic"
)";

TEST(ConfigTest, LayersParseWithDefaults) {
  const TrainConfig c = Parse(kLayers);
  ASSERT_EQ(c.model.layers.size(), 8u);
  const auto& L = c.model.layers;
  EXPECT_EQ(L[0].type, "conv2d");
  EXPECT_EQ(L[0].name, "conv1");
  EXPECT_EQ(L[0].out, 32);
  EXPECT_EQ(L[0].kernel, 3);
  EXPECT_EQ(L[0].stride, 1);
  EXPECT_EQ(L[0].pad, 1);
  EXPECT_TRUE(L[0].bias);
  EXPECT_EQ(L[1].type, "relu");
  EXPECT_EQ(L[1].name, "1");  // the index, like nn.Sequential
  EXPECT_EQ(L[2].type, "maxpool");
  EXPECT_EQ(L[2].kernel, 2);  // pool defaults: kernel 2, stride = kernel
  EXPECT_EQ(L[2].stride, 2);
  EXPECT_EQ(L[3].kernel, 3);
  EXPECT_EQ(L[3].stride, 1);
  EXPECT_EQ(L[3].pad, 1);
  EXPECT_EQ(L[4].name, "4");
  EXPECT_DOUBLE_EQ(L[5].p, 0.25);
  EXPECT_EQ(L[6].type, "flatten");
  EXPECT_EQ(L[7].name, "fc");
  EXPECT_EQ(L[7].out, 10);
  EXPECT_FALSE(L[7].bias);
  EXPECT_TRUE(c.model.name.empty());
}

TEST(ConfigTest, LayersRoundTripThroughToToml) {
  const TrainConfig c = Parse(kLayers);
  const std::string text = ToToml(c);
  EXPECT_EQ(ParseConfig(text, kSource), c) << text;
  EXPECT_EQ(ConfigHash(ParseConfig(text, kSource)), ConfigHash(c));
  EXPECT_THAT(text, Not(HasSubstr("name = \"\"")));
}

// The keys and types of the standard CNN families: grouped and dilated convs, ceil-mode pools,
// an average without the padding, the activations and a squeeze-and-excitation product.
TEST(ConfigTest, LayersOfMobileNetStyleBlocksParseAndRoundTrip) {
  const TrainConfig c = Parse(R"([model]
classes = 10
layers = [
  {type = "conv2d", name = "dw", out = 8, kernel = 3, pad = 2, groups = 8, dilation = 2},
  {type = "hardswish", name = "act"},
  {type = "avgpool", kernel = 3, stride = 2, pad = 1, ceil_mode = true, count_include_pad = false},
  {type = "conv2d", name = "fc1", out = 8, kernel = 1},
  {type = "hardsigmoid"},
  {type = "mul", name = "scale", inputs = ["4", "act"]},
  {type = "maxpool", kernel = 3, stride = 2, ceil_mode = true},
  {type = "relu6"}, {type = "sigmoid"}, {type = "tanh"},
  {type = "flatten"},
  {type = "linear", name = "fc", out = 10},
]
[data]
train = "synthetic"
)");
  const auto& L = c.model.layers;
  ASSERT_EQ(L.size(), 12u);
  EXPECT_EQ(L[0].groups, 8);
  EXPECT_EQ(L[0].dilation, 2);
  EXPECT_TRUE(L[2].ceil_mode);
  EXPECT_FALSE(L[2].count_include_pad);
  EXPECT_EQ(L[3].groups, 1);  // defaults
  EXPECT_EQ(L[3].dilation, 1);
  EXPECT_EQ(L[5].type, "mul");
  EXPECT_TRUE(L[6].ceil_mode);
  EXPECT_TRUE(L[6].count_include_pad);
  const std::string text = ToToml(c);
  EXPECT_EQ(ParseConfig(text, kSource), c) << text;
}

TEST(ConfigTest, LayersAsArrayOfTables) {
  const TrainConfig c = Parse(R"([[model.layers]]
type = "flatten"
[[model.layers]]
type = "linear"
out = 10
[data]
train = "synthetic"
)");
  ASSERT_EQ(c.model.layers.size(), 2u);
  EXPECT_EQ(c.model.layers[1].out, 10);
}

// `layers` text for a [model] table whose layers are given, data included. Layer i is on
// line 3 + i.
std::string WithLayers(std::string_view layers) {
  return "[model]\nlayers = [\n" + std::string(layers) + "]\n[data]\ntrain = \"synthetic\"\n";
}

TEST(ConfigTest, LayerErrorsNameLayerKeyAndLine) {
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"flatten\"},\n{type = \"relu\"},\n"
                                 "{type = \"conv2d\", out = 8, kernl = 3},\n")),
              HasSubstr("configs/x.toml:5: unknown key 'model.layers[2].kernl' (did you mean "
                        "'model.layers[2].kernel'?)"));
  EXPECT_THAT(ErrorOf(WithLayers("{out = 3},\n")),
              HasSubstr("configs/x.toml:3: model.layers[0]: missing key 'type'"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"relu\"},\n{type = \"conv\"},\n")),
              HasSubstr("configs/x.toml:4: model.layers[1].type: unknown layer type \"conv\""));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"convv2d\"},\n")),
              HasSubstr("unknown layer type \"convv2d\" (did you mean \"conv2d\"?)"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"conv2d\", kernel = 3},\n")),
              HasSubstr("configs/x.toml:3: model.layers[0].out is required for a conv2d layer"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"conv2d\", out = 3},\n")),
              HasSubstr("model.layers[0].kernel is required for a conv2d layer"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"linear\"},\n")),
              HasSubstr("model.layers[0].out is required for a linear layer"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"linear\", out = 0},\n")),
              HasSubstr("configs/x.toml:3: model.layers[0].out must be >= 1, got 0"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"linear\", out = 4, kernel = 3},\n")),
              HasSubstr("model.layers[0].kernel does not apply to a linear layer (linear takes "
                        "out, bias)"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"relu\", p = 0.5},\n")),
              HasSubstr("model.layers[0].p does not apply to a relu layer"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"dropout\", p = 1.0},\n")),
              HasSubstr("model.layers[0].p must be in [0, 1)"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"conv2d\", out = 4, kernel = 3, stride = 0},\n")),
              HasSubstr("model.layers[0].stride must be >= 1"));
  // Upper bounds (models/model_spec.h): 2^31 went on to oneDNN and ended as an internal error.
  EXPECT_THAT(
      ErrorOf(WithLayers("{type = \"conv2d\", out = 4, kernel = 3, stride = 2147483648},\n")),
      HasSubstr("model.layers[0].stride must be <= 1048576, got 2147483648"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"linear\", out = 2147483648},\n")),
              HasSubstr("model.layers[0].out must be <= 16777216, got 2147483648"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"maxpool\", kernel = 2, stride = 2147483648},\n")),
              HasSubstr("model.layers[0].stride must be <= 1048576"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"maxpool\", kernel = 2, pad = 2},\n")),
              HasSubstr("model.layers[0].pad must be <= kernel / 2"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"linear\", out = 2.0},\n")),
              HasSubstr("model.layers[0].out: expected an integer, got float 2.0"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"relu\", name = \"a\"},\n{type = \"relu\", name = "
                                 "\"a\"},\n")),
              HasSubstr("configs/x.toml:4: model.layers[1].name \"a\" is already used by "
                        "model.layers[0]"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"relu\", name = \"a.b\"},\n")),
              HasSubstr("model.layers[0].name must be non-empty and contain no '.'"));
  EXPECT_THAT(ErrorOf(WithLayers("\"relu\",\n")),
              HasSubstr("model.layers[0]: expected a table like {type = \"relu\"}"));
  EXPECT_THAT(ErrorOf(WithLayers("")), HasSubstr("configs/x.toml:2: model.layers is empty"));
  EXPECT_THAT(ErrorOf("[model]\nlayers = \"relu\"\n[data]\ntrain = \"synthetic\"\n"),
              HasSubstr("configs/x.toml:2: model.layers: expected an array of layer tables"));
}

// A residual and a dense block written in TOML: `inputs` names earlier layers.
constexpr char kGraphLayers[] = R"([model]
layers = [
  {type = "conv2d", name = "stem", out = 8, kernel = 3, pad = 1},
  {type = "conv2d", name = "conv", out = 8, kernel = 3, pad = 1},
  {type = "add", name = "sum", inputs = ["stem", "conv"]},
  {type = "concat", name = "cat", inputs = ["sum", "stem"]},
  {type = "relu", inputs = ["cat"]},
  {type = "flatten"},
  {type = "linear", name = "fc", out = 10},
]
[data]
train = "synthetic"
)";

TEST(ConfigTest, LayersWithInputsParseAndRoundTrip) {
  const TrainConfig c = Parse(kGraphLayers);
  ASSERT_EQ(c.model.layers.size(), 7u);
  EXPECT_EQ(c.model.layers[2].inputs, (std::vector<std::string>{"stem", "conv"}));
  EXPECT_EQ(c.model.layers[4].inputs, (std::vector<std::string>{"cat"}));
  EXPECT_TRUE(c.model.layers[5].inputs.empty());  // the previous layer
  const std::string text = ToToml(c);
  EXPECT_THAT(text, HasSubstr("inputs = [\"stem\", \"conv\"]"));
  EXPECT_EQ(ParseConfig(text, kSource), c) << text;
}

TEST(ConfigTest, LayerInputErrorsNameTheLayer) {
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"relu\", name = \"a\"},\n{type = \"add\"},\n")),
              HasSubstr("configs/x.toml:4: model.layers[1]: a add layer joins several layers: "
                        "give inputs"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"relu\", name = \"a\"},\n{type = \"concat\", inputs = "
                                 "[\"a\"]},\n")),
              HasSubstr("at least two names of earlier layers"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"relu\", name = \"a\"},\n{type = \"add\", inputs = "
                                 "[\"a\", \"b\"]},\n{type = \"relu\", name = \"b\"},\n")),
              HasSubstr("configs/x.toml:4: model.layers[1].inputs: \"b\" is not the name of an "
                        "earlier layer"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"relu\", name = \"a\"},\n{type = \"relu\", name = "
                                 "\"b\", inputs = [\"a\", \"a\"]},\n")),
              HasSubstr("model.layers[1].inputs: a relu layer reads one layer's output; only add, "
                        "mul and concat take several"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"relu\", name = \"a\", inputs = [1]},\n")),
              HasSubstr("model.layers[0].inputs[0]: expected a string"));
}

TEST(ConfigTest, LayerKeysOfTheCnnFamiliesAreChecked) {
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"conv2d\", out = 6, kernel = 3, groups = 4},\n")),
              HasSubstr("model.layers[0].groups (4) must divide out (6)"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"conv2d\", out = 6, kernel = 3, dilation = 0},\n")),
              HasSubstr("model.layers[0].dilation must be >= 1, got 0"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"maxpool\", count_include_pad = false},\n")),
              HasSubstr("count_include_pad does not apply to a maxpool layer"));
  EXPECT_THAT(ErrorOf(WithLayers("{type = \"mul\", inputs = [\"a\"]},\n")),
              HasSubstr("a mul layer joins several layers"));
}

}  // namespace
}  // namespace dptrain
