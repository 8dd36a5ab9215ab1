// SPDX-License-Identifier: Apache-2.0
// The HDF5 dataset: round trips through WriteHdf5Dataset, both cache modes, concurrency, and
// DescribeHdf5File. Every validation error is in hdf5_dataset_errors_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include "core/error.h"
#include "datasets/dataset.h"
#include "datasets/hdf5_writer.h"
#include "datasets/inspect.h"
#include "tests/testing/hdf5_files.h"
#include "tests/unit/hdf5_dataset_test_util.h"

namespace dptrain {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

TEST(Hdf5DatasetTest, WriteAndReadBackU8) {
  TempDir dir;
  const std::string path = dir.File("d.h5");
  const auto d = testing::WriteSmallU8Dataset(path, 20, 1, 4, 5, 10);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  for (const char* mode : {"ram", "chunks", "auto"}) {
    auto ds = OpenHdf5Dataset(path, Mode(mode));
    const DatasetInfo& info = ds->info();
    EXPECT_EQ(info.path, path);
    EXPECT_EQ(info.size, 20);
    EXPECT_EQ(info.sample_shape, Shape({1, 4, 5}));
    EXPECT_EQ(info.image_dtype, DType::kU8);
    EXPECT_EQ(info.classes, 10);
    EXPECT_TRUE(info.mean.empty());
    const std::vector<int64_t> idx = {19, 0, 7, 7};
    std::vector<float> img(size_t{4} * 20);
    std::vector<int32_t> lab(4);
    ds->Read(idx.data(), 4, img.data(), lab.data());
    for (size_t k = 0; k < idx.size(); ++k) {
      EXPECT_EQ(lab[k], d.labels[static_cast<size_t>(idx[k])]) << mode;
      for (size_t j = 0; j < 20; ++j) {
        ASSERT_EQ(img[k * 20 + j], d.images[static_cast<size_t>(idx[k]) * 20 + j] / 255.0f)
            << mode << " sample " << idx[k] << " pixel " << j;
      }
    }
  }
}

TEST(Hdf5DatasetTest, WriteAndReadBackF32WithMeanStd) {
  TempDir dir;
  const std::string path = dir.File("f.h5");
  std::vector<float> images(size_t{6} * 2 * 3 * 3);
  for (size_t i = 0; i < images.size(); ++i) images[i] = 0.25f * static_cast<float>(i) - 3.0f;
  const std::vector<int32_t> labels = {0, 1, 2, 0, 1, 2};
  WriteHdf5Dataset(path, images.data(), Shape({6, 2, 3, 3}), labels.data(), 3, {0.5f, 0.25f},
                   {2.0f});
  auto ds = OpenHdf5Dataset(path, Mode("chunks"));
  EXPECT_EQ(ds->info().image_dtype, DType::kF32);
  EXPECT_EQ(ds->info().mean, (std::vector<float>{0.5f, 0.25f}));
  EXPECT_EQ(ds->info().std, (std::vector<float>{2.0f}));
  std::vector<float> img(18);
  int32_t lab = -1;
  const int64_t i = 4;
  ds->Read(&i, 1, img.data(), &lab);
  EXPECT_EQ(lab, 1);
  for (size_t j = 0; j < 18; ++j) EXPECT_EQ(img[j], images[size_t{4} * 18 + j]);
}

TEST(Hdf5DatasetTest, RamAndChunksModesGiveIdenticalData) {
  TempDir dir;
  const std::string path = dir.File("big.h5");
  // 3x32x32 = 3072 bytes per sample -> 341 samples per 1 MiB chunk -> 3 chunks.
  testing::WriteSmallU8Dataset(path, 1000, 3, 32, 32, 10);
  auto ram = OpenHdf5Dataset(path, Mode("ram"));
  OpenOptions small = Mode("chunks");
  small.chunk_cache_bytes = 1;  // keeps the minimum (2 blocks): forces evictions
  auto chunks = OpenHdf5Dataset(path, small);
  OpenOptions no_ram = Mode("auto");
  no_ram.ram_limit_bytes = 1000;  // auto falls back to chunks
  auto autom = OpenHdf5Dataset(path, no_ram);
  std::mt19937_64 rng(5);
  for (int round = 0; round < 20; ++round) {
    std::vector<int64_t> idx(64);
    for (auto& i : idx) i = static_cast<int64_t>(rng() % 1000);
    std::vector<float> a(size_t{64} * 3072), b(size_t{64} * 3072), c(size_t{64} * 3072);
    std::vector<int32_t> la(64), lb(64), lc(64);
    ram->Read(idx.data(), 64, a.data(), la.data());
    chunks->Read(idx.data(), 64, b.data(), lb.data());
    autom->Read(idx.data(), 64, c.data(), lc.data());
    ASSERT_EQ(a, b);
    ASSERT_EQ(a, c);
    ASSERT_EQ(la, lb);
    ASSERT_EQ(la, lc);
  }
}

TEST(Hdf5DatasetTest, ConcurrentReadsAreCorrect) {
  TempDir dir;
  const std::string path = dir.File("c.h5");
  testing::WriteSmallU8Dataset(path, 1000, 3, 32, 32, 10);
  auto ram = OpenHdf5Dataset(path, Mode("ram"));
  OpenOptions o = Mode("chunks");
  o.chunk_cache_bytes = 1;
  auto chunks = OpenHdf5Dataset(path, o);
  std::vector<std::thread> threads;
  threads.reserve(4);
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t));
      std::vector<int64_t> idx(32);
      std::vector<float> a(size_t{32} * 3072), b(size_t{32} * 3072);
      std::vector<int32_t> la(32), lb(32);
      for (int round = 0; round < 20; ++round) {
        for (auto& i : idx) i = static_cast<int64_t>(rng() % 1000);
        ram->Read(idx.data(), 32, a.data(), la.data());
        chunks->Read(idx.data(), 32, b.data(), lb.data());
        if (a != b || la != lb) ++mismatches;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Hdf5DatasetTest, ThreeDimensionalImagesHaveOneChannel) {
  TempDir dir;
  const std::string path = dir.File("nhw.h5");
  std::vector<uint8_t> img(size_t{3} * 2 * 2);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>(i * 20);
  const std::vector<int64_t> lab = {2, 0, 1};  // int64 labels
  WriteRaw(path, H5Elem::kU8, {3, 2, 2}, img.data(), H5Elem::kI64, {3}, lab.data(), 2);
  auto ds = OpenHdf5Dataset(path, Mode("chunks"));
  EXPECT_EQ(ds->info().sample_shape, Shape({1, 2, 2}));
  EXPECT_EQ(ds->info().classes, -1);
  std::vector<float> out(4);
  int32_t l = -1;
  const int64_t i = 2;
  ds->Read(&i, 1, out.data(), &l);
  EXPECT_EQ(l, 1);
  EXPECT_EQ(out[3], 220 / 255.0f);
}

TEST(Hdf5DatasetTest, AnyIntegerLabelTypeAndClassesOnLabels) {
  TempDir dir;
  const std::vector<uint8_t> img(size_t{4} * 4, 7);
  {
    const std::string path = dir.File("u8labels.h5");
    const std::vector<uint8_t> lab = {0, 1, 2, 3};
    WriteRaw(path, H5Elem::kU8, {4, 1, 2, 2}, img.data(), H5Elem::kU8, {4}, lab.data());
    EXPECT_EQ(OpenHdf5Dataset(path, Mode("ram"))->info().size, 4);
  }
  {
    const std::string path = dir.File("i16labels.h5");
    const std::vector<int16_t> lab = {3, 2, 1, 0};
    Hdf5Writer w(path);
    w.WriteArray("/images", H5Elem::kU8, {4, 1, 2, 2}, img.data());
    w.WriteArray("/labels", H5Elem::kI16, {4}, lab.data());
    w.SetIntAttr("/labels", "classes", 5);  // classes on /labels is read too
    w.Close();
    auto ds = OpenHdf5Dataset(path, Mode("ram"));
    EXPECT_EQ(ds->info().classes, 5);
    std::vector<float> out(size_t{4} * 4);
    std::vector<int32_t> l(4);
    const std::vector<int64_t> idx = {0, 1, 2, 3};
    ds->Read(idx.data(), 4, out.data(), l.data());
    EXPECT_EQ(l, (std::vector<int32_t>{3, 2, 1, 0}));
  }
}

TEST(Hdf5DatasetTest, ModelClassesWhenFileHasNone) {
  TempDir dir;
  const std::string path = dir.File("noclasses.h5");
  const std::vector<uint8_t> img(4, 1);
  const std::vector<int32_t> lab = {0, 1, 2, 3};
  WriteRaw(path, H5Elem::kU8, {4, 1, 1, 1}, img.data(), H5Elem::kI32, {4}, lab.data());
  EXPECT_EQ(OpenHdf5Dataset(path, Mode("ram", 4))->info().classes, 4);
}

// ---- inspect ----

TEST(Hdf5DatasetTest, DescribeDatasetFile) {
  TempDir dir;
  const std::string path = dir.File("d.h5");
  testing::WriteSmallU8Dataset(path, 30, 1, 28, 28, 3);
  const std::string text = DescribeHdf5File(path);
  EXPECT_THAT(text, HasSubstr("/images  uint8 [30, 1, 28, 28]  chunks [30, 1, 28, 28]"));
  EXPECT_THAT(text, HasSubstr("/labels  int32 [30]"));
  EXPECT_THAT(text, HasSubstr("@classes = 3"));
  EXPECT_THAT(text, HasSubstr("samples  30"));
  EXPECT_THAT(text, HasSubstr("per class 0:10 1:10 2:10"));
  EXPECT_THAT(text, HasSubstr("valid    yes"));
}

TEST(Hdf5DatasetTest, DescribeCheckpointLikeFile) {
  TempDir dir;
  const std::string path = dir.File("ckpt.h5");
  Hdf5Writer w(path);
  const std::vector<float> wgt(size_t{32} * 9, 0.5f);
  w.WriteArray("/params/conv1.weight", H5Elem::kF32, {32, 1, 3, 3}, wgt.data());
  w.WriteArray("/optimizer/conv1.weight/momentum", H5Elem::kF32, {32, 1, 3, 3}, wgt.data());
  w.CreateGroup("/state");
  w.SetIntAttr("/state", "step", 1200);
  w.SetDoubleAttr("/state", "lr", 0.05);
  w.SetStringAttr("/state", "dptrain_version", "0.1.0");
  w.WriteString("/config", "seed = 42\n[model]\nname = \"ref_cnn\"\n");
  w.Close();
  const std::string text = DescribeHdf5File(path);
  EXPECT_THAT(text, HasSubstr("/params/conv1.weight  float32 [32, 1, 3, 3]"));
  EXPECT_THAT(text, HasSubstr("/optimizer/conv1.weight/momentum  float32"));
  EXPECT_THAT(text, HasSubstr("/state/  group"));
  EXPECT_THAT(text, HasSubstr("@step = 1200"));
  EXPECT_THAT(text, HasSubstr("@lr = 0.05"));
  EXPECT_THAT(text, HasSubstr("@dptrain_version = \"0.1.0\""));
  EXPECT_THAT(text, HasSubstr("/config  string scalar"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("dataset summary")));
}

TEST(Hdf5DatasetTest, DescribeReportsInvalidDataset) {
  TempDir dir;
  const std::string path = dir.File("bad.h5");
  const std::vector<uint8_t> img(size_t{3} * 4);
  const std::vector<int32_t> lab = {0, 1};
  WriteRaw(path, H5Elem::kU8, {3, 1, 2, 2}, img.data(), H5Elem::kI32, {2}, lab.data());
  EXPECT_THAT(DescribeHdf5File(path), HasSubstr("valid    NO"));
}

TEST(Hdf5DatasetTest, DescribeMissingOrNonHdf5IsIoError) {
  TempDir dir;
  EXPECT_THROW(DescribeHdf5File(dir.File("missing.h5")), IoError);
  testing::WriteBytes(dir.File("x.txt"), "hello");
  try {
    DescribeHdf5File(dir.File("x.txt"));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir.File("x.txt")));
  }
}

}  // namespace
}  // namespace dptrain
