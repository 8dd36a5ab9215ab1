// SPDX-License-Identifier: Apache-2.0
// Config errors and --set: every error names the key and where its value came from (file line or
// --set), and --set overrides of every type.
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
// Errors from the file: key, line, what was wrong.

TEST(ConfigTest, ErrorIsConfigErrorWithUsageExitCode) {
  try {
    Parse(MinimalWith("[train]\nlr = \"fast\"\n"));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(ConfigTest, SyntaxErrorHasLineAndColumn) {
  const std::string msg = ErrorOf("[model]\nname = \"ref_cnn\"\nclasses = = 3\n");
  EXPECT_THAT(msg, HasSubstr("configs/x.toml:3:"));
  EXPECT_THAT(msg, HasSubstr("TOML syntax error"));
  // An unquoted string in the file gets a hint.
  EXPECT_THAT(ErrorOf("[model]\nname = \"ref_cnn\"\n[data]\ntrain = data/x.h5\n"),
              AllOf(HasSubstr("configs/x.toml:4:"), HasSubstr("strings are quoted")));
}

TEST(ConfigTest, WrongTypeNamesKeyLineAndValue) {
  // kMinimal is 5 lines; [train] is line 6, lr line 7.
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nlr = \"fast\"\n")),
              HasSubstr("configs/x.toml:7: train.lr: expected a number, got string \"fast\""));
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nnesterov = 1\n")),
              HasSubstr("configs/x.toml:7: train.nesterov: expected a boolean"));
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\noptimizer = 3\n")),
              HasSubstr("configs/x.toml:7: train.optimizer: expected a string, got integer 3"));
  EXPECT_THAT(ErrorOf("seed = \"x\"\n" + std::string(kMinimal)),
              HasSubstr("configs/x.toml:1: seed: expected an integer, got string \"x\""));
}

TEST(ConfigTest, FloatForIntKeyIsError) {
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nepochs = 1.5\n")),
              HasSubstr("configs/x.toml:7: train.epochs: expected an integer, got float 1.5"));
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nglobal_batch = 64.0\n")),
              AllOf(HasSubstr("train.global_batch: expected an integer, got float 64.0"),
                    HasSubstr("without a decimal point")));
}

TEST(ConfigTest, NonFiniteFloatIsError) {
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nlr = nan\n")),
              HasSubstr("configs/x.toml:7: train.lr: expected a finite number"));
}

TEST(ConfigTest, ArrayElementTypeIsChecked) {
  EXPECT_THAT(ErrorOf(MinimalWith("mean = [0.5, \"x\"]\nstd = [1, 1]\n")),
              HasSubstr("configs/x.toml:6: data.mean[1]: expected a number, got string \"x\""));
  EXPECT_THAT(ErrorOf(MinimalWith("mean = 0.5\n")),
              HasSubstr("configs/x.toml:6: data.mean: expected an array of numbers"));
}

TEST(ConfigTest, UnknownKeyNamesKeyAndLine) {
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nepochs = 3\nlrr = 0.1\n")),
              HasSubstr("configs/x.toml:8: unknown key 'train.lrr' (did you mean 'train.lr'?)"));
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nnesterv = true\n")),
              HasSubstr("unknown key 'train.nesterv' (did you mean 'train.nesterov'?)"));
  // A key in the wrong table is found by its last component.
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nseed = 1\n")),
              HasSubstr("configs/x.toml:7: unknown key 'train.seed' (did you mean 'seed'?)"));
  // Nothing close: no suggestion.
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nzzzzzzzz = 1\n")),
              AllOf(HasSubstr("unknown key 'train.zzzzzzzz'"), Not(HasSubstr("did you mean"))));
}

TEST(ConfigTest, UnknownTopLevelKeyAndTable) {
  EXPECT_THAT(ErrorOf("rundir = \"x\"\n" + std::string(kMinimal)),
              HasSubstr("configs/x.toml:1: unknown key 'rundir' (did you mean 'run_dir'?)"));
  EXPECT_THAT(ErrorOf(MinimalWith("[trian]\nlr = 0.1\n")),
              HasSubstr("configs/x.toml:6: unknown table '[trian]' (did you mean '[train]'?)"));
  EXPECT_THAT(ErrorOf(MinimalWith("[train.extra]\nx = 1\n")),
              HasSubstr("unknown key 'train.extra'"));
  EXPECT_THAT(ErrorOf("train = 5\n" + std::string(kMinimal)),
              HasSubstr("configs/x.toml:1: 'train' must be a table ([train]), got integer 5"));
}

TEST(ConfigTest, DottedKeysAtTopLevelWork) {
  const TrainConfig c = Parse(std::string("train.lr = 0.2\n") + kMinimal);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.2);
}

// Range checks from the file point at the key's line.
TEST(ConfigTest, RangeErrorFromFileNamesLine) {
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nepochs = 2\nglobal_batch = 0\n")),
              HasSubstr("configs/x.toml:8: train.global_batch must be >= 1, got 0"));
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nlr = -0.1\n")),
              HasSubstr("configs/x.toml:7: train.lr must be > 0"));
}

// Every range / enum check, through --set so the origin is the --set item.
TEST(ConfigTest, EveryRangeCheckNamesKeyAndSet) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"seed=-1", "seed must be >= 0"},
      {"run_dir=", "run_dir must not be empty"},
      {"model.classes=0", "model.classes must be >= 1"},
      {"model.loss=hinge", "model.loss must be one of"},
      {"data.train=", "data.train is required"},
      {"data.augment=flip", "data.augment must be one of \"none\", \"crop-flip\""},
      {"data.workers=-1", "data.workers must be >= 0"},
      // Upper bounds: the value as given, not narrowed to an int on the way (4294967295 was -1).
      {"data.workers=4294967295", "data.workers must be <= 256, got 4294967295"},
      {"data.synthetic_samples=0", "data.synthetic_samples must be >= 1"},
      {"data.cache=disk", "data.cache must be one of"},
      {"train.epochs=-1", "train.epochs must be >= 0"},
      {"train.max_steps=-1", "train.max_steps must be >= 0"},
      {"train.global_batch=0", "train.global_batch must be >= 1"},
      {"train.accumulate=0", "train.accumulate must be >= 1"},
      {"train.accumulate=3", "train.global_batch (128) must be divisible by train.accumulate (3)"},
      {"train.optimizer=adam",
       "train.optimizer must be one of \"sgd\", \"adamw\", \"lars\", got \"adam\" "
       "(did you mean \"adamw\"?)"},
      {"train.lr=0", "train.lr must be > 0"},
      {"train.momentum=1", "train.momentum must be in [0, 1)"},
      {"train.momentum=-0.1", "train.momentum must be in [0, 1)"},
      {"train.weight_decay=-1", "train.weight_decay must be >= 0"},
      {"train.beta1=1.0", "train.beta1 must be in [0, 1)"},
      {"train.beta2=-0.5", "train.beta2 must be in [0, 1)"},
      {"train.eps=0", "train.eps must be > 0"},
      {"train.schedule=linear", "train.schedule must be one of"},
      {"train.step_size=-1", "train.step_size must be >= 0"},
      {"train.gamma=0", "train.gamma must be > 0"},
      {"train.warmup_steps=-5", "train.warmup_steps must be >= 0"},
      {"train.label_smoothing=1", "train.label_smoothing must be in [0, 1)"},
      {"train.clip_grad_norm=-1", "train.clip_grad_norm must be >= 0"},
      {"train.lars_eta=0", "train.lars_eta must be > 0"},
      {"train.schedule=multistep", "train.schedule = \"multistep\" needs train.milestones"},
      {"train.milestones=[30, 60]", "train.milestones applies to train.schedule = \"multistep\""},
      {"train.precision=fp8", "train.precision must be one of"},
      {"train.log_every_steps=0", "train.log_every_steps must be >= 1"},
      {"train.eval_every_epochs=-1", "train.eval_every_epochs must be >= 0"},
      {"checkpoint.every_steps=-1", "checkpoint.every_steps must be >= 0"},
      {"checkpoint.every_epochs=-1", "checkpoint.every_epochs must be >= 0"},
      {"checkpoint.keep=0", "checkpoint.keep must be >= 1"},
      {"checkpoint.resume=", "checkpoint.resume must be"},
      {"memory.limit=lots", "memory.limit: \"lots\" is not a positive size"},
      {"memory.limit=0", "memory.limit: \"0\" is not a positive size"},
      {"memory.limit=0.5", "memory.limit: \"0.5\" is less than one byte"},
      {"memory.limit=9EB", "memory.limit: \"9EB\" is not a positive size"},
      {"memory.limit=\"99999999TiB\"", "memory.limit: \"99999999TiB\" is too large"},
      {"dist.device=tpu", "dist.device must be one of"},
      {"dist.backend=gloo", "dist.backend must be one of"},
      {"dist.device_binding=pin", "dist.device_binding must be one of"},
      {"dist.gpus=0,,1", "dist.gpus: empty entry"},
      {"dist.bucket_mb=0", "dist.bucket_mb must be >= 1"},
      {"dist.bucket_mb=9007199254740992", "dist.bucket_mb must be <= 1048576"},
      {"dist.collective_timeout_s=0", "dist.collective_timeout_s must be > 0"},
      {"dist.threads=-1", "dist.threads must be >= 0"},
      {"dist.threads=100000", "dist.threads must be <= 1024, got 100000"},
      {"dist.threads=2147483648", "dist.threads must be <= 1024, got 2147483648"},
      {"dist.check_replicas_every=-1", "dist.check_replicas_every must be >= 0"},
  };
  for (const auto& [set, expected] : cases) {
    SCOPED_TRACE(set);
    const std::string msg = ErrorOf(kMinimal, {set});
    EXPECT_THAT(msg, HasSubstr("--set " + set + ": "));
    EXPECT_THAT(msg, HasSubstr(expected));
  }
}

TEST(ConfigTest, CrossKeyChecks) {
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nepochs = 0\n")),
              HasSubstr("configs/x.toml:7: train.epochs and train.max_steps are both 0"));
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nmomentum = 0.0\nnesterov = true\n")),
              HasSubstr("configs/x.toml:8: train.nesterov = true needs train.momentum > 0"));
  EXPECT_THAT(ErrorOf(kMinimal, {"dist.device=cpu", "dist.backend=nccl"}),
              HasSubstr("--set dist.backend=nccl: dist.backend = \"nccl\" needs GPUs"));
  // global_batch divisible by accumulate: 128 / 4 is fine, 100 / 8 is not.
  EXPECT_EQ(Parse(kMinimal, {"train.accumulate=4"}).train.accumulate, 4);
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nglobal_batch = 100\naccumulate = 8\n")),
              HasSubstr("configs/x.toml:8: train.global_batch (100) must be divisible by "
                        "train.accumulate (8)"));
}

// The recipe knobs of issue 14: milestones with multistep (ascending), no warm-up under
// onecycle (it has its own), no label smoothing on a regression.
TEST(ConfigTest, ScheduleAndLossRecipeChecks) {
  const TrainConfig c =
      Parse(kMinimal, {"train.schedule=multistep", "train.milestones=[30, 60, 80]",
                       "train.label_smoothing=0.1", "train.clip_grad_norm=1"});
  EXPECT_EQ(c.train.milestones, (std::vector<double>{30, 60, 80}));
  EXPECT_DOUBLE_EQ(c.train.label_smoothing, 0.1);
  EXPECT_DOUBLE_EQ(c.train.clip_grad_norm, 1.0);
  EXPECT_EQ(ParseConfig(ToToml(c), kSource), c);
  EXPECT_THAT(ErrorOf(kMinimal, {"train.schedule=multistep", "train.milestones=[30, 20]"}),
              HasSubstr("train.milestones must be ascending epochs > 0, got [30.0, 20.0]"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.schedule=onecycle", "train.warmup_steps=100"}),
              HasSubstr("train.warmup_steps does not apply to train.schedule = \"onecycle\""));
  EXPECT_THAT(ErrorOf(kMinimal, {"model.loss=mse", "train.label_smoothing=0.1"}),
              HasSubstr("train.label_smoothing applies to the cross-entropy loss"));
  EXPECT_EQ(Parse(kMinimal, {"train.schedule=onecycle"}).train.schedule, ScheduleKind::kOneCycle);
  const TrainConfig d = Parse(MinimalWith("[train]\nno_weight_decay = [\"bias\", \"bn\"]\n"));
  EXPECT_EQ(d.train.no_weight_decay, (std::vector<std::string>{"bias", "bn"}));
  EXPECT_EQ(ParseConfig(ToToml(d), kSource), d);
  EXPECT_EQ(Parse(kMinimal, {"train.no_weight_decay=[\"bn\"]"}).train.no_weight_decay,
            (std::vector<std::string>{"bn"}));
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nno_weight_decay = [\"norm\"]\n")),
              HasSubstr("configs/x.toml:7: train.no_weight_decay: unknown group \"norm\"; the "
                        "groups are \"bias\""));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.optimizer=lars", "dist.shard=optimizer"}),
              HasSubstr("train.optimizer = \"lars\" needs every tensor whole on each rank"));
  EXPECT_EQ(Parse(kMinimal, {"train.optimizer=lars"}).train.optimizer, OptimizerKind::kLars);
  EXPECT_EQ(Parse(MinimalWith("[train]\nno_weight_decay = \"bias\"\n")).train.no_weight_decay,
            (std::vector<std::string>{"bias"}))
      << "a single string is a list of one";
  EXPECT_THAT(ErrorOf(MinimalWith("[train]\nno_weight_decay = 3\n")),
              HasSubstr("train.no_weight_decay: expected a string or an array of strings"));
}

TEST(ConfigTest, DataChecks) {
  EXPECT_THAT(ErrorOf("[model]\nname = \"ref_cnn\"\n"),
              HasSubstr("configs/x.toml: data.train is required"));
  EXPECT_THAT(ErrorOf(MinimalWith("mean = [0.5, 0.5]\nstd = [0.2]\n")),
              HasSubstr("configs/x.toml:7: data.mean has 2 entries but data.std has 1"));
  EXPECT_THAT(ErrorOf(MinimalWith("mean = [0.5, 0.5]\nstd = [0.2, 0]\n")),
              HasSubstr("configs/x.toml:7: data.std[1] must be > 0"));
}

TEST(ConfigTest, ModelNeedsExactlyOneOfNameAndLayers) {
  EXPECT_THAT(ErrorOf("[data]\ntrain = \"synthetic\"\n"),
              HasSubstr("configs/x.toml: no model: set model.name"));
  EXPECT_THAT(ErrorOf("[model]\nname = \"mlp\"\nlayers = [{type = \"relu\"}]\n"
                      "[data]\ntrain = \"synthetic\"\n"),
              HasSubstr("configs/x.toml:2: model.name and model.layers are both set"));
}

TEST(ConfigTest, MemoryLimitIsParsed) {
  EXPECT_EQ(Parse(kMinimal, {"memory.limit=512MiB"}).memory.limit_bytes, size_t{512} << 20);
  EXPECT_EQ(Parse(kMinimal, {"memory.limit=1048576"}).memory.limit_bytes, size_t{1048576});
  EXPECT_THAT(ErrorOf(MinimalWith("[memory]\nlimit = \"2 apples\"\n")),
              HasSubstr("configs/x.toml:7: memory.limit: \"2 apples\" is not a positive size"));
}

TEST(ConfigTest, ResumeTakesAutoNeverOrPath) {
  EXPECT_EQ(Parse(kMinimal, {"checkpoint.resume=never"}).checkpoint.resume, "never");
  EXPECT_EQ(
      Parse(kMinimal, {"checkpoint.resume=runs/a/checkpoints/ckpt-00000100.h5"}).checkpoint.resume,
      "runs/a/checkpoints/ckpt-00000100.h5");
}

// ------------------------------------------------------------------------------------------
// --set

TEST(ConfigTest, SetStringsNeedNoQuotes) {
  const TrainConfig c =
      Parse(kMinimal, {"data.train=/data/x.h5", "data.test=\"/data/t.h5\"", "run_dir='runs/q'",
                       "model.name=mlp", "train.optimizer=adamw", "dist.gpus=0,1"});
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"/data/x.h5"}));
  EXPECT_EQ(c.data.test, (std::vector<std::string>{"/data/t.h5"}));
  EXPECT_EQ(c.run_dir, "runs/q");
  EXPECT_EQ(c.model.name, "mlp");
  EXPECT_EQ(ConfigName(c.train.optimizer), "adamw");
  EXPECT_EQ(c.dist.gpus, "0,1");
}

TEST(ConfigTest, DataFilesAreAStringAListOrPatterns) {
  EXPECT_EQ(Parse("[model]\nname = \"ref_cnn\"\n[data]\ntrain = \"synthetic\"\n"
                  "test = [\"t-0.h5\", \"shards/t-*.h5\"]\n")
                .data.test,
            (std::vector<std::string>{"t-0.h5", "shards/t-*.h5"}));
  const TrainConfig c =
      Parse(kMinimal, {"data.train=[\"a.h5\", \"b-*.h5\"]", "data.test=imagenet/val-*.h5"});
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"a.h5", "b-*.h5"}));
  EXPECT_EQ(c.data.test, (std::vector<std::string>{"imagenet/val-*.h5"}));
  EXPECT_TRUE(Parse(kMinimal, {"data.test="}).data.test.empty()) << "empty: no evaluation";
  EXPECT_THAT(ErrorOf(kMinimal, {"data.train=[]"}), HasSubstr("data.train is required"));
  // The run's config.toml writes lists, which read back the same.
  const TrainConfig back = Parse(ToToml(c));
  EXPECT_EQ(back.data.train, c.data.train);
  EXPECT_EQ(back.data.test, c.data.test);
}

TEST(ConfigTest, SetEachType) {
  const TrainConfig c = Parse(kMinimal, {"train.lr=0.1", "train.epochs=3", "train.nesterov=true",
                                         "data.shuffle=false", "data.mean=[0.5]", "data.std=[0.25]",
                                         "dist.collective_timeout_s=10", "seed=12345678901"});
  EXPECT_DOUBLE_EQ(c.train.lr, 0.1);
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_TRUE(c.train.nesterov);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.data.mean, std::vector<double>{0.5});
  EXPECT_EQ(c.data.std, std::vector<double>{0.25});
  EXPECT_DOUBLE_EQ(c.dist.collective_timeout_s, 10.0);
  EXPECT_EQ(c.seed, 12345678901);
}

TEST(ConfigTest, SetOverridesFileAndLaterSetWins) {
  const TrainConfig c = Parse(MinimalWith("[train]\nlr = 0.3\n"), {"train.lr=0.2", "train.lr=0.4"});
  EXPECT_DOUBLE_EQ(c.train.lr, 0.4);
  // An override that makes the value valid again hides the file's bad value.
  EXPECT_EQ(Parse(MinimalWith("[train]\nglobal_batch = 0\n"), {"train.global_batch=64"})
                .train.global_batch,
            64);
}

TEST(ConfigTest, SetErrors) {
  EXPECT_THAT(ErrorOf(kMinimal, {"train.lr"}), HasSubstr("--set train.lr: expected key=value"));
  EXPECT_THAT(ErrorOf(kMinimal, {"=3"}), HasSubstr("--set =3: missing key"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.lrr=0.1"}),
              HasSubstr("--set train.lrr=0.1: unknown key 'train.lrr' (did you mean 'train.lr'?)"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.lr=abc"}),
              HasSubstr("--set train.lr=abc: train.lr: expected a number, got 'abc'"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.lr=\"fast\""}),
              HasSubstr("--set train.lr=\"fast\": train.lr: expected a number, got string"));
  EXPECT_THAT(
      ErrorOf(kMinimal, {"train.epochs=2.5"}),
      HasSubstr("--set train.epochs=2.5: train.epochs: expected an integer, got float 2.5"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.nesterov=yes"}),
              HasSubstr("--set train.nesterov=yes: train.nesterov: expected a boolean"));
  EXPECT_THAT(ErrorOf(kMinimal, {"data.mean=[0.5, x]"}),
              HasSubstr("--set data.mean=[0.5, x]: data.mean: expected an array of numbers"));
  EXPECT_THAT(ErrorOf(kMinimal, {"data.mean=0.5"}),
              HasSubstr("--set data.mean=0.5: data.mean: expected an array of numbers like [0.5]"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.epochs="}),
              HasSubstr("--set train.epochs=: train.epochs: expected an integer"));
  EXPECT_THAT(ErrorOf(kMinimal, {"train.epochs=3\nlr = 4"}),
              HasSubstr("train.epochs: expected a single value"));
  // Larger than int64: the value is refused, naming the key.
  EXPECT_THAT(ErrorOf(kMinimal, {"seed=99999999999999999999"}),
              HasSubstr("--set seed=99999999999999999999: seed: expected an integer"));
}

// Fuzzing regression (tests/fuzz/corpus/config/regress_set_invalid_utf8.toml): a --set string
// is taken as written, and one that is not UTF-8 was accepted, so the saved config.toml (and
// the config in checkpoints) could not be read back.
TEST(ConfigTest, SetStringsMustBeUtf8) {
  for (const std::string bad :
       {"\xe3\xe3/x.h5", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "x\xe3\x81", "\xff"}) {
    EXPECT_THAT(ErrorOf(kMinimal, {"data.train=" + bad}),
                HasSubstr("data.train: the value is not valid UTF-8 text"));
  }
  const TrainConfig c = ParseConfig(kMinimal, "x.toml", {"data.train=/données/日本/\U0001F600.h5"});
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"/données/日本/\U0001F600.h5"}));
  EXPECT_EQ(ParseConfig(ToToml(c), c.source), c);
}

TEST(ConfigTest, SetLayersIsUnsupported) {
  EXPECT_THAT(ErrorOf(kMinimal, {"model.layers=[{type=\"relu\"}]"}),
              HasSubstr("model.layers cannot be set with --set"));
  EXPECT_THAT(ErrorOf(kMinimal, {"model.layers[0].out=3"}),
              HasSubstr("--set model.layers[0].out=3: model.layers cannot be set with --set"));
}

}  // namespace
}  // namespace dptrain
