// SPDX-License-Identifier: Apache-2.0
// Checkpoint files: round trip of every field, atomic writes (no temporary left, `keep`, a full
// disk leaves the previous checkpoints intact), verified reads (flipped byte, truncated file, not
// HDF5: the message names the file and the tensor), resume=auto's choice, model matching in one
// message, the `module.` prefix, parameters-only files and the background writer.
#include "runtime/checkpoint/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "datasets/hdf5_writer.h"
#include "tests/testing/hdf5_files.h"

namespace dptrain {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

CheckpointTensor F32(const std::string& name, std::vector<int64_t> shape, float base) {
  CheckpointTensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.f32.resize(static_cast<size_t>(t.numel()));
  // Distinctive values, so a test can find the tensor's bytes in the file.
  for (size_t i = 0; i < t.f32.size(); ++i) t.f32[i] = base + 0.001f * static_cast<float>(i);
  return t;
}

// A small checkpoint: a conv + batch-norm + linear model trained with SGD momentum.
Checkpoint MakeCheckpoint(int64_t step, const std::string& prefix = "") {
  Checkpoint c;
  c.state.step = step;
  c.state.epoch = 2;
  c.state.samples_in_epoch = 96;
  c.state.seed = 7;
  c.state.world_size_at_save = 4;
  c.state.global_batch = 32;
  c.state.accumulate = 2;
  c.state.dataset_size = 512;
  c.state.steps_per_epoch = 16;
  c.state.optimizer_steps = step;
  c.state.optimizer = "sgd";
  c.state.schedule = "cosine";
  c.state.lr = 0.0123;
  c.state.last_eval_step = 32;
  c.state.elapsed_s = 12.5;
  c.config_toml = "seed = 7\n[model]\nname = \"x\"\n";
  c.optimizer_kind = "sgd";
  c.params.push_back(F32(prefix + "conv.weight", {4, 1, 3, 3}, 1000.f));
  c.params.push_back(F32(prefix + "conv.bias", {4}, 2000.f));
  c.params.push_back(F32(prefix + "bn.weight", {4}, 3000.f));
  c.params.push_back(F32(prefix + "bn.running_mean", {4}, 4000.f));
  CheckpointTensor nbt;
  nbt.name = prefix + "bn.num_batches_tracked";
  nbt.dtype = CheckpointDType::kI64;
  nbt.i64 = {step * 2};
  c.params.push_back(nbt);
  c.params.push_back(F32(prefix + "fc.weight", {3, 64}, 5000.f));
  for (const auto* p : {"conv.weight", "conv.bias", "bn.weight", "fc.weight"}) {
    const CheckpointTensor* t = nullptr;
    for (const auto& q : c.params) {
      if (q.name == prefix + p) t = &q;
    }
    CheckpointTensor m = F32(prefix + p + std::string("/momentum_buffer"), t->shape, 6000.f);
    c.optimizer.push_back(m);
  }
  return c;
}

std::vector<TensorSpec> ModelSpecs() {
  return {{"conv.weight", {4, 1, 3, 3}},
          {"conv.bias", {4}},
          {"bn.weight", {4}},
          {"bn.running_mean", {4}},
          {"bn.num_batches_tracked", {}, CheckpointDType::kI64, true},
          {"fc.weight", {3, 64}}};
}

// Expects fn to throw CheckpointError (exit code 6) whose message has every string in parts.
template <class F>
void ExpectCheckpointError(F&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.exit_code(), kExitCheckpoint);
    for (const std::string& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

std::vector<std::string> Names(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  out.reserve(paths.size());
  for (const auto& p : paths) out.push_back(fs::path(p).filename().string());
  return out;
}

TEST(CheckpointTest, FileNamesHaveEightDigits) {
  EXPECT_EQ(CheckpointFileName(1200), "ckpt-00001200.h5");
  EXPECT_EQ(CheckpointFileName(0), "ckpt-00000000.h5");
  EXPECT_EQ(CheckpointFileName(123456789), "ckpt-123456789.h5");
}

TEST(CheckpointTest, Crc32MatchesZlib) {
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(Crc32("", 0), 0u);
}

TEST(CheckpointTest, RoundTripKeepsEveryField) {
  TempDir dir;
  const Checkpoint c = MakeCheckpoint(48);
  const CheckpointWriteStats w = WriteCheckpoint(dir.path(), c, 3);
  EXPECT_EQ(w.path, dir.File("ckpt-00000048.h5"));
  EXPECT_GT(w.bytes, 0);
  EXPECT_THAT(Names(ListCheckpoints(dir.path())), ElementsAre("ckpt-00000048.h5"));
  EXPECT_FALSE(fs::exists(dir.File(".ckpt-00000048.h5.tmp")));

  const Checkpoint r = ReadCheckpoint(w.path);
  EXPECT_TRUE(r.has_state);
  EXPECT_TRUE(r.notices.empty());
  EXPECT_EQ(r.state.step, 48);
  EXPECT_EQ(r.state.epoch, 2);
  EXPECT_EQ(r.state.samples_in_epoch, 96);
  EXPECT_EQ(r.state.seed, 7);
  EXPECT_EQ(r.state.world_size_at_save, 4);
  EXPECT_EQ(r.state.global_batch, 32);
  EXPECT_EQ(r.state.accumulate, 2);
  EXPECT_EQ(r.state.dataset_size, 512);
  EXPECT_EQ(r.state.steps_per_epoch, 16);
  EXPECT_EQ(r.state.optimizer_steps, 48);
  EXPECT_EQ(r.state.optimizer, "sgd");
  EXPECT_EQ(r.state.schedule, "cosine");
  EXPECT_EQ(r.state.lr, 0.0123);
  EXPECT_EQ(r.state.last_eval_step, 32);
  EXPECT_EQ(r.state.elapsed_s, 12.5);
  EXPECT_EQ(r.state.format_version, kCheckpointFormatVersion);
  EXPECT_FALSE(r.state.dptrain_version.empty());
  EXPECT_THAT(r.state.created, HasSubstr("T"));
  EXPECT_EQ(r.config_toml, c.config_toml);
  EXPECT_EQ(r.optimizer_kind, "sgd");
  ASSERT_EQ(r.params.size(), c.params.size());
  ASSERT_EQ(r.optimizer.size(), c.optimizer.size());
  for (const auto& t : c.params) {
    const CheckpointTensor* got = r.FindParam(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    EXPECT_EQ(got->shape, t.shape) << t.name;
    EXPECT_EQ(got->dtype, t.dtype) << t.name;
    EXPECT_EQ(got->f32, t.f32) << t.name;
    EXPECT_EQ(got->i64, t.i64) << t.name;
  }
  for (const auto& t : c.optimizer) {
    const CheckpointTensor* got = r.FindOptimizer(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    EXPECT_EQ(got->f32, t.f32) << t.name;
  }
  EXPECT_NO_THROW(MatchCheckpoint(w.path, r, ModelSpecs(), nullptr));
  EXPECT_TRUE(IsCheckpointFile(w.path));
  const std::string desc = DescribeCheckpoint(w.path);
  for (const char* s :
       {"step 48", "epoch 2", "world_size_at_save 4", "global_batch 32", "conv.weight",
        "[4, 1, 3, 3]", "fc.weight/momentum_buffer", "verdict: valid", "name = \"x\""}) {
    EXPECT_THAT(desc, HasSubstr(s));
  }
}

TEST(CheckpointTest, KeepDeletesTheOldestOnlyAfterTheNewOneIsComplete) {
  TempDir dir;
  for (int64_t step : {10, 20, 30, 40, 50}) {
    const CheckpointWriteStats w = WriteCheckpoint(dir.path(), MakeCheckpoint(step), 2);
    EXPECT_LE(w.deleted.size(), 1u);
  }
  EXPECT_THAT(Names(ListCheckpoints(dir.path())),
              ElementsAre("ckpt-00000050.h5", "ckpt-00000040.h5"));
  // A checkpoint of a lower step (an older run resumed from a path) is kept all the same.
  WriteCheckpoint(dir.path(), MakeCheckpoint(5), 2);
  EXPECT_THAT(Names(ListCheckpoints(dir.path())),
              ElementsAre("ckpt-00000050.h5", "ckpt-00000005.h5"));
}

TEST(CheckpointTest, TemporariesAndOtherFilesAreNeverListed) {
  TempDir dir;
  WriteCheckpoint(dir.path(), MakeCheckpoint(3), 3);
  WriteBytes(dir.File(".ckpt-00000009.h5.tmp"), "partial");
  WriteBytes(dir.File("ckpt-9.h5"), "x");
  WriteBytes(dir.File("ckpt-00000009.h5.bak"), "x");
  WriteBytes(dir.File("notes.txt"), "x");
  EXPECT_THAT(Names(ListCheckpoints(dir.path())), ElementsAre("ckpt-00000003.h5"));
  EXPECT_THAT(Names(RemoveStaleTemporaries(dir.path())), ElementsAre(".ckpt-00000009.h5.tmp"));
  EXPECT_FALSE(fs::exists(dir.File(".ckpt-00000009.h5.tmp")));
  EXPECT_TRUE(fs::exists(dir.File("notes.txt")));
  EXPECT_TRUE(ListCheckpoints(dir.File("missing")).empty());
}

TEST(CheckpointTest, FlippedByteIsReportedWithFileAndTensor) {
  TempDir dir;
  const Checkpoint c = MakeCheckpoint(8);
  const std::string path = WriteCheckpoint(dir.path(), c, 3).path;
  std::string bytes = ReadBytes(path);
  const CheckpointTensor& fc = c.params.back();
  ASSERT_EQ(fc.name, "fc.weight");
  const std::string needle(reinterpret_cast<const char*>(fc.f32.data()), fc.f32.size() * 4);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos) << "fc.weight's bytes are not stored contiguously";
  bytes[at + 100] = static_cast<char>(bytes[at + 100] ^ 0x10);
  WriteBytes(path, bytes);
  ExpectCheckpointError([&] { ReadCheckpoint(path); },
                        {path, "/params/fc.weight", "checksum mismatch", "1 problem"});
  const std::string desc = DescribeCheckpoint(path);
  EXPECT_THAT(desc, HasSubstr("CRC32 MISMATCH"));
  EXPECT_THAT(desc, HasSubstr("verdict: INVALID"));
}

TEST(CheckpointTest, FlippedByteInTheStateIsReported) {
  // The resume position is as precious as the weights: a damaged step or seed would resume a
  // different run without a word.
  TempDir dir;
  Checkpoint c = MakeCheckpoint(8);
  c.state.dataset_size = 0x5A17F00D5EEDLL;  // distinctive bytes, stored once in the file
  const std::string path = WriteCheckpoint(dir.path(), c, 3).path;
  EXPECT_EQ(ReadCheckpoint(path).state.dataset_size, c.state.dataset_size);
  EXPECT_THAT(DescribeCheckpoint(path), ::testing::ContainsRegex("/state crc32 [0-9a-f]{8} ok"));
  std::string bytes = ReadBytes(path);
  const int64_t v = c.state.dataset_size;
  const std::string needle(reinterpret_cast<const char*>(&v), sizeof v);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bytes.find(needle, at + 1), std::string::npos);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x01);
  WriteBytes(path, bytes);
  ExpectCheckpointError([&] { ReadCheckpoint(path); },
                        {path, "/state: checksum mismatch", "changed after the save"});
  const std::string desc = DescribeCheckpoint(path);
  EXPECT_THAT(desc, HasSubstr("/state CRC32 MISMATCH"));
  EXPECT_THAT(desc, HasSubstr("verdict: INVALID"));
}

TEST(CheckpointTest, StateWithoutAChecksumIsReadAsBefore) {
  // Files written before /state had a crc32 still resume.
  TempDir dir;
  const Checkpoint c = MakeCheckpoint(8);
  const std::string path = WriteCheckpoint(dir.path(), c, 3).path;
  {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hid_t g = H5Gopen2(f, "state", H5P_DEFAULT);
    ASSERT_GE(g, 0);
    EXPECT_GE(H5Adelete(g, "crc32"), 0);
    H5Gclose(g);
    H5Fclose(f);
  }
  EXPECT_EQ(ReadCheckpoint(path).state.step, 8);
  const std::string desc = DescribeCheckpoint(path);
  EXPECT_THAT(desc, HasSubstr("/state no checksum"));
  EXPECT_THAT(desc, HasSubstr("verdict: valid"));
}

TEST(CheckpointTest, TruncatedEmptyAndForeignFilesAreRejected) {
  TempDir dir;
  const std::string path = WriteCheckpoint(dir.path(), MakeCheckpoint(8), 3).path;
  const std::string bytes = ReadBytes(path);
  WriteBytes(dir.File("half.h5"), bytes.substr(0, bytes.size() / 2));
  ExpectCheckpointError([&] { ReadCheckpoint(dir.File("half.h5")); },
                        {dir.File("half.h5"), "truncated"});
  WriteBytes(dir.File("empty.h5"), "");
  ExpectCheckpointError([&] { ReadCheckpoint(dir.File("empty.h5")); },
                        {dir.File("empty.h5"), "not an HDF5 file"});
  ExpectCheckpointError([&] { ReadCheckpoint(dir.File("none.h5")); },
                        {dir.File("none.h5"), "no such file"});
  const std::string data = dir.File("data.h5");
  testing::WriteSmallU8Dataset(data, 4, 1, 2, 2, 3);
  ExpectCheckpointError([&] { ReadCheckpoint(data); }, {data, "no /params group"});
  EXPECT_FALSE(IsCheckpointFile(data));
}

TEST(CheckpointTest, AutoResumeSkipsInvalidFilesAndNeverPicksPartialOnes) {
  TempDir dir;
  for (int64_t step : {10, 20, 30}) WriteCheckpoint(dir.path(), MakeCheckpoint(step), 5);
  // The newest is torn (as a non-atomic writer would leave it); a temporary is even newer.
  const std::string newest = dir.File("ckpt-00000030.h5");
  const std::string bytes = ReadBytes(newest);
  WriteBytes(newest, bytes.substr(0, bytes.size() - 4096));
  WriteBytes(dir.File(".ckpt-00000040.h5.tmp"), bytes.substr(0, 1000));
  std::vector<std::string> skipped;
  const auto found = FindLatestCheckpoint(dir.path(), &skipped);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->path, dir.File("ckpt-00000020.h5"));
  EXPECT_EQ(found->ckpt.state.step, 20);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr(newest));

  TempDir empty;
  skipped.clear();
  EXPECT_FALSE(FindLatestCheckpoint(empty.path(), &skipped).has_value());
  EXPECT_TRUE(skipped.empty());
}

TEST(CheckpointTest, MismatchListsEveryProblemInOneMessage) {
  TempDir dir;
  const std::string path = WriteCheckpoint(dir.path(), MakeCheckpoint(8), 3).path;
  const Checkpoint c = ReadCheckpoint(path);
  // Another model: fc.weight has another shape, conv.bias is gone, head.weight is new.
  std::vector<TensorSpec> other = {{"conv.weight", {4, 1, 3, 3}}, {"bn.weight", {4}},
                                   {"bn.running_mean", {4}},      {"fc.weight", {10, 64}},
                                   {"head.weight", {10, 3}},      {"head.bias", {10}}};
  std::vector<TensorSpec> opt = {{"conv.weight/exp_avg", {4, 1, 3, 3}}};
  ExpectCheckpointError(
      [&] { MatchCheckpoint(path, c, other, &opt); },
      {path, "2 missing: head.weight [10, 3], head.bias [10]",
       "unexpected: bn.num_batches_tracked [], conv.bias [4]",
       "fc.weight is float32 [3, 64] in the file, float32 [10, 64] in the model",
       "/optimizer: 1 missing: conv.weight/exp_avg", "4 unexpected: bn.weight/momentum_buffer"});
  // num_batches_tracked may be absent (dptrain does not use it).
  Checkpoint no_nbt = c;
  std::erase_if(no_nbt.params,
                [](const CheckpointTensor& t) { return t.name == "bn.num_batches_tracked"; });
  ASSERT_EQ(no_nbt.params.size(), c.params.size() - 1);
  EXPECT_NO_THROW(MatchCheckpoint(path, no_nbt, ModelSpecs(), nullptr));
}

TEST(CheckpointTest, UniformModulePrefixIsStrippedWithANotice) {
  TempDir dir;
  const std::string path = WriteCheckpoint(dir.path(), MakeCheckpoint(8, "module."), 3).path;
  const Checkpoint c = ReadCheckpoint(path);
  EXPECT_NE(c.FindParam("conv.weight"), nullptr);
  EXPECT_NE(c.FindOptimizer("fc.weight/momentum_buffer"), nullptr);
  ASSERT_EQ(c.notices.size(), 2u);
  EXPECT_THAT(c.notices[0], HasSubstr("'module.'"));
  EXPECT_NO_THROW(MatchCheckpoint(path, c, ModelSpecs(), nullptr));
}

TEST(CheckpointTest, ParametersOnlyFilesLoadWithoutStateOrChecksums) {
  TempDir dir;
  // As a user would export a torch state_dict with h5py: /params only.
  const std::string path = dir.File("torch.h5");
  {
    Hdf5Writer w(path);
    const std::vector<float> v(4, 0.5f);
    w.WriteArray("/params/conv.bias", H5Elem::kF32, {4}, v.data());
    const int64_t n = 3;
    w.WriteArray("/params/bn.num_batches_tracked", H5Elem::kI64, {}, &n);
    w.Close();
  }
  const Checkpoint c = ReadCheckpoint(path);
  EXPECT_FALSE(c.has_state);
  ASSERT_NE(c.FindParam("conv.bias"), nullptr);
  EXPECT_EQ(c.FindParam("conv.bias")->f32, std::vector<float>(4, 0.5f));
  EXPECT_EQ(c.FindParam("bn.num_batches_tracked")->i64, std::vector<int64_t>{3});
  EXPECT_THAT(DescribeCheckpoint(path), HasSubstr("parameters file"));
  // float64 tensors are refused by name.
  {
    Hdf5Writer w(dir.File("f64.h5"));
    const std::vector<double> v(4, 0.5);
    w.WriteArray("/params/conv.bias", H5Elem::kF64, {4}, v.data());
    w.Close();
  }
  ExpectCheckpointError([&] { ReadCheckpoint(dir.File("f64.h5")); },
                        {"/params/conv.bias", "float64"});
}

TEST(CheckpointTest, FullDiskFailsCleanlyAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  const std::string first = WriteCheckpoint(dir.path(), MakeCheckpoint(1), 1).path;
  const std::string before = ReadBytes(first);
  // The temporary name is a link to /dev/full: every write gets ENOSPC from the kernel.
  ASSERT_EQ(::symlink("/dev/full", dir.File(".ckpt-00000002.h5.tmp").c_str()), 0);
  ExpectCheckpointError([&] { WriteCheckpoint(dir.path(), MakeCheckpoint(2), 1); },
                        {dir.File("ckpt-00000002.h5"), "No space left on device", "ENOSPC",
                         "previous checkpoints are intact"});
  EXPECT_FALSE(fs::exists(dir.File("ckpt-00000002.h5")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir.File(".ckpt-00000002.h5.tmp"))));
  EXPECT_THAT(Names(ListCheckpoints(dir.path())), ElementsAre("ckpt-00000001.h5"));
  EXPECT_EQ(ReadBytes(first), before);
}

TEST(CheckpointTest, UncreatableDirectoryIsACheckpointError) {
  TempDir dir;
  WriteBytes(dir.File("file"), "x");
  ExpectCheckpointError([&] { WriteCheckpoint(dir.File("file/sub"), MakeCheckpoint(1), 1); },
                        {dir.File("file/sub"), "cannot create the directory"});
}

TEST(CheckpointTest, BackgroundWriterWritesInOrderAndReportsFailuresOnce) {
  TempDir dir;
  {
    CheckpointWriter w(dir.path(), 5);
    w.Submit(MakeCheckpoint(1));
    w.Submit(MakeCheckpoint(2));  // waits for the first
    w.Wait();
    const auto done = w.TakeCompleted();
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(done[0].path, dir.File("ckpt-00000001.h5"));
    EXPECT_EQ(done[1].path, dir.File("ckpt-00000002.h5"));
    EXPECT_TRUE(w.TakeCompleted().empty());
  }
  WriteBytes(dir.File("file"), "x");
  CheckpointWriter bad(dir.File("file/sub"), 5);
  bad.Submit(MakeCheckpoint(3));
  for (int i = 0; i < 500 && !bad.failed(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(bad.failed());
  bad.Submit(MakeCheckpoint(4));  // dropped: the first failure stays pending
  ExpectCheckpointError([&] { bad.Wait(); }, {"ckpt-00000003.h5"});
  EXPECT_FALSE(bad.failed());
  EXPECT_NO_THROW(bad.Wait());
}

}  // namespace
}  // namespace dptrain
