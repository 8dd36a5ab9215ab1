// SPDX-License-Identifier: Apache-2.0
// Config parsing: defaults, a full round trip through ToToml, hashing, and LoadConfig. Errors and
// --set are in config_errors_test.cc, model.layers in config_layers_test.cc.
#include "launcher/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/unit/config_test_util.h"

namespace dptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Every key set to a value other than its default.
constexpr char kFull[] = R"(# a full config
run_dir = "runs/full"
seed = 7

[model]
name = "cifar_net"
classes = 100
loss = "cross_entropy"

[data]
train = "data/cifar/train.h5"
test = "data/cifar/test.h5"
mean = [0.4914, 0.4822, 0.4465]
std = [0.247, 0.2435, 0.2616]
shuffle = false
augment = "crop-flip"
workers = 0
synthetic_samples = 1000
cache = "chunks"

[train]
epochs = 0
max_steps = 1000
global_batch = 256
accumulate = 4
optimizer = "adamw"
lr = 3e-4
momentum = 0.8
nesterov = true
weight_decay = 0.01
beta1 = 0.85
beta2 = 0.95
eps = 1e-6
schedule = "step"
step_size = 300
gamma = 0.5
warmup_steps = 100
precision = "bf16"
log_every_steps = 10
eval_every_epochs = 2
deterministic = true
cudnn_benchmark = true
winograd = true
tf32 = false
profile = true

[checkpoint]
every_steps = 500
every_epochs = 0
keep = 5
resume = "never"
init = "pretrained/ckpt.h5"

[memory]
limit = "2GiB"
auto_microbatch = true
recompute = true

[dist]
device = "cuda"
backend = "nccl"
device_binding = "set-device"
gpus = "2,3"
bucket_mb = 50
collective_timeout_s = 60.5
threads = 4
check_replicas_every = 0
)";

TEST(ConfigTest, DefaultsWhenKeysAbsent) {
  const TrainConfig c = Parse(kMinimal);
  EXPECT_EQ(c.source, kSource);
  EXPECT_EQ(c.run_dir, "runs/default");
  EXPECT_EQ(c.seed, 42);
  EXPECT_EQ(c.model.name, "ref_cnn");
  EXPECT_EQ(c.model.classes, 10);
  EXPECT_TRUE(c.model.layers.empty());
  EXPECT_EQ(ConfigName(c.model.loss), "auto");
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"synthetic"}));
  EXPECT_TRUE(c.data.test.empty());
  EXPECT_TRUE(c.data.mean.empty());
  EXPECT_TRUE(c.data.std.empty());
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(ConfigName(c.data.augment), "none");
  EXPECT_EQ(c.data.workers, 2);
  EXPECT_EQ(c.data.synthetic_samples, 8192);
  EXPECT_EQ(ConfigName(c.data.cache), "auto");

  const TrainLoopConfig defaults;
  EXPECT_EQ(c.train, defaults);
  EXPECT_EQ(c.train.epochs, 5);
  EXPECT_EQ(c.train.global_batch, 128);
  EXPECT_EQ(ConfigName(c.train.optimizer), "sgd");
  EXPECT_DOUBLE_EQ(c.train.lr, 0.05);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 5e-4);
  EXPECT_EQ(ConfigName(c.train.schedule), "constant");
  EXPECT_EQ(ConfigName(c.train.precision), "fp32");
  EXPECT_TRUE(c.train.tf32);  // as PyTorch's convolutions

  EXPECT_EQ(c.checkpoint, CheckpointConfig{});
  EXPECT_EQ(c.checkpoint.resume, "auto");
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.memory, MemoryConfig{});
  EXPECT_EQ(c.memory.limit_bytes, 0u);
  EXPECT_EQ(c.dist, DistConfig{});
  EXPECT_EQ(ConfigName(c.dist.device_binding), "remap");
  EXPECT_EQ(c.dist.bucket_mb, 25);
  EXPECT_DOUBLE_EQ(c.dist.collective_timeout_s, 300);
}

TEST(ConfigTest, FullConfigValues) {
  const TrainConfig c = Parse(kFull);
  EXPECT_EQ(c.run_dir, "runs/full");
  EXPECT_EQ(c.seed, 7);
  EXPECT_EQ(c.model.name, "cifar_net");
  EXPECT_EQ(c.model.classes, 100);
  EXPECT_EQ(ConfigName(c.model.loss), "cross_entropy");
  EXPECT_EQ(c.data.test, (std::vector<std::string>{"data/cifar/test.h5"}));
  EXPECT_EQ(c.data.mean, (std::vector<double>{0.4914, 0.4822, 0.4465}));
  EXPECT_EQ(c.data.std, (std::vector<double>{0.247, 0.2435, 0.2616}));
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(ConfigName(c.data.augment), "crop-flip");
  EXPECT_EQ(c.data.workers, 0);
  EXPECT_EQ(c.data.synthetic_samples, 1000);
  EXPECT_EQ(ConfigName(c.data.cache), "chunks");
  EXPECT_EQ(c.train.epochs, 0);
  EXPECT_EQ(c.train.max_steps, 1000);
  EXPECT_EQ(c.train.global_batch, 256);
  EXPECT_EQ(c.train.accumulate, 4);
  EXPECT_EQ(ConfigName(c.train.optimizer), "adamw");
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.train.momentum, 0.8);
  EXPECT_TRUE(c.train.nesterov);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.train.beta1, 0.85);
  EXPECT_DOUBLE_EQ(c.train.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.train.eps, 1e-6);
  EXPECT_EQ(ConfigName(c.train.schedule), "step");
  EXPECT_EQ(c.train.step_size, 300);
  EXPECT_DOUBLE_EQ(c.train.gamma, 0.5);
  EXPECT_EQ(c.train.warmup_steps, 100);
  EXPECT_EQ(ConfigName(c.train.precision), "bf16");
  EXPECT_EQ(c.train.log_every_steps, 10);
  EXPECT_EQ(c.train.eval_every_epochs, 2);
  EXPECT_TRUE(c.train.deterministic);
  EXPECT_TRUE(c.train.cudnn_benchmark);
  EXPECT_TRUE(c.train.winograd);
  EXPECT_FALSE(c.train.tf32);
  EXPECT_TRUE(c.train.profile);
  EXPECT_EQ(c.checkpoint.every_steps, 500);
  EXPECT_EQ(c.checkpoint.every_epochs, 0);
  EXPECT_EQ(c.checkpoint.keep, 5);
  EXPECT_EQ(c.checkpoint.resume, "never");
  EXPECT_EQ(c.checkpoint.init, "pretrained/ckpt.h5");
  EXPECT_EQ(c.memory.limit, "2GiB");
  EXPECT_EQ(c.memory.limit_bytes, size_t{2} << 30);
  EXPECT_TRUE(c.memory.auto_microbatch);
  EXPECT_TRUE(c.memory.recompute);
  EXPECT_EQ(ConfigName(c.dist.device), "cuda");
  EXPECT_EQ(ConfigName(c.dist.backend), "nccl");
  EXPECT_EQ(ConfigName(c.dist.device_binding), "set-device");
  EXPECT_EQ(c.dist.gpus, "2,3");
  EXPECT_EQ(c.dist.bucket_mb, 50);
  EXPECT_DOUBLE_EQ(c.dist.collective_timeout_s, 60.5);
  EXPECT_EQ(c.dist.threads, 4);
  EXPECT_EQ(c.dist.check_replicas_every, 0);
}

TEST(ConfigTest, FullConfigRoundTripsThroughToToml) {
  const TrainConfig c = Parse(kFull);
  const std::string text = ToToml(c);
  const TrainConfig again = ParseConfig(text, c.source);
  EXPECT_EQ(again, c) << text;
  EXPECT_EQ(ConfigHash(again), ConfigHash(c));
  EXPECT_EQ(ToToml(again), text);
  // Every key is written, with its effective value.
  EXPECT_THAT(text, HasSubstr("\n[train]\n"));
  EXPECT_THAT(text, HasSubstr("lr = 3e-04\n"));
  EXPECT_THAT(text, HasSubstr("limit = \"2GiB\"\n"));
  EXPECT_THAT(text, HasSubstr("check_replicas_every = 0\n"));
}

TEST(ConfigTest, DefaultsRoundTripAndFloatsStayFloats) {
  const TrainConfig c = Parse(kMinimal);
  const std::string text = ToToml(c);
  EXPECT_EQ(ParseConfig(text, kSource), c) << text;
  EXPECT_THAT(text, HasSubstr("collective_timeout_s = 300.0\n"));
  EXPECT_THAT(text, HasSubstr("epochs = 5\n"));
  EXPECT_THAT(text, HasSubstr("seed = 42\n"));
}

TEST(ConfigTest, AwkwardValuesRoundTripExactly) {
  TrainConfig c = Parse(kMinimal);
  c.run_dir = "runs/with \"quotes\" \\ and\ttab";
  c.train.lr = 0.1 + 0.2;  // not representable in few digits
  c.train.eps = 1e-300;
  c.data.mean = {1.0 / 3, 2};
  c.data.std = {1e20, 0.1};
  const TrainConfig again = ParseConfig(ToToml(c), kSource);
  EXPECT_EQ(again, c) << ToToml(c);
}

TEST(ConfigTest, HashIsStableAndSensitive) {
  const TrainConfig a = Parse(kFull);
  const TrainConfig b = ParseConfig(kFull, "elsewhere/y.toml");
  EXPECT_EQ(ConfigHash(a), ConfigHash(b));  // independent of where it was read from
  const TrainConfig c = Parse(kFull, {"train.lr=0.0004"});
  EXPECT_NE(ConfigHash(a), ConfigHash(c));
  EXPECT_NE(ConfigHash(Parse(kMinimal)), ConfigHash(a));
}

TEST(ConfigTest, EmptySourceIsCalledString) {
  EXPECT_EQ(ParseConfig(kMinimal, "").source, "<string>");
  try {
    ParseConfig("seed = -1\n" + std::string(kMinimal), "");
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("<string>:1: seed must be >= 0"));
  }
}

TEST(ConfigTest, IntegerAcceptedForFloatKey) {
  EXPECT_DOUBLE_EQ(Parse(MinimalWith("[train]\nlr = 1\n")).train.lr, 1.0);
}

// ------------------------------------------------------------------------------------------
// LoadConfig

TEST(ConfigTest, LoadConfigMissingFileNamesPath) {
  try {
    LoadConfig("/nonexistent/dir/cfg.toml");
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/dir/cfg.toml: cannot read config file"));
  }
  const std::string dir = testing::TempDir();
  EXPECT_THROW(LoadConfig(dir), ConfigError);
}

TEST(ConfigTest, LoadConfigReadsFileAndUsesPathInMessages) {
  const std::filesystem::path path =
      std::filesystem::path(testing::TempDir()) / "dptrain_config_test.toml";
  {
    std::ofstream out(path);
    out << kMinimal << "[train]\nlr = \"fast\"\n";
  }
  try {
    LoadConfig(path.string());
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path.string() + ":7: train.lr: expected a number"));
  }
  {
    std::ofstream out(path);
    out << kMinimal;
  }
  const TrainConfig c = LoadConfig(path.string(), {"train.epochs=1"});
  EXPECT_EQ(c.source, path.string());
  EXPECT_EQ(c.train.epochs, 1);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace dptrain
