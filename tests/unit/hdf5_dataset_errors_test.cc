// SPDX-License-Identifier: Apache-2.0
// The HDF5 dataset's validation errors: each is a DataError whose message names the file and
// (where there is one) the HDF5 dataset; also the writer's checks and the in-memory dataset.
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

// ---- Errors: each names the file and (where there is one) the HDF5 dataset. ----

TEST(Hdf5DatasetTest, MissingFile) {
  TempDir dir;
  const std::string path = dir.File("nope.h5");
  ExpectOpenError(path, {path, "no such file"});
}

TEST(Hdf5DatasetTest, NotAnHdf5File) {
  TempDir dir;
  const std::string path = dir.File("text.h5");
  testing::WriteBytes(path, "this is not HDF5\n");
  ExpectOpenError(path, {path, "not an HDF5 file"});
}

TEST(Hdf5DatasetTest, TruncatedFile) {
  TempDir dir;
  const std::string path = dir.File("trunc.h5");
  testing::WriteSmallU8Dataset(path, 200, 1, 28, 28, 10);
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  try {
    OpenHdf5Dataset(path, Mode("ram"));
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    EXPECT_THAT(e.what(), HasSubstr("truncated"));
  }
  std::filesystem::resize_file(path, 100);  // inside the superblock area
  ExpectOpenError(path, {path});
}

// Fuzzing regression: HDF5 reads never-written storage as fill values, so a 731-byte file can
// declare /images of 2^40 samples (or samples of 2^40 bytes); validation used to allocate by the
// declared shape. The files come from tests/fuzz/make_corpus.py.
TEST(Hdf5DatasetTest, ShapeLargerThanTheFileIsDataError) {
  for (const char* name : {"regress_sparse_huge.h5", "regress_sparse_huge_sample.h5"}) {
    const std::string path =
        std::string(DPTRAIN_SOURCE_DIR) + "/tests/fuzz/corpus/hdf5_dataset/" + name;
    for (const char* cache : {"auto", "ram", "chunks"}) {
      SCOPED_TRACE(std::string(name) + " cache=" + cache);
      ExpectOpenError(path, {path, "/images has shape", "the data is missing"}, Mode(cache));
    }
  }
}

TEST(Hdf5DatasetTest, MissingImages) {
  TempDir dir;
  const std::string path = dir.File("noimages.h5");
  Hdf5Writer w(path);
  const std::vector<int32_t> lab = {0};
  w.WriteArray("/labels", H5Elem::kI32, {1}, lab.data());
  w.Close();
  ExpectOpenError(path, {path, "/images", "not found"});
}

TEST(Hdf5DatasetTest, MissingLabels) {
  TempDir dir;
  const std::string path = dir.File("nolabels.h5");
  Hdf5Writer w(path);
  const std::vector<uint8_t> img(4);
  w.WriteArray("/images", H5Elem::kU8, {1, 1, 2, 2}, img.data());
  w.Close();
  ExpectOpenError(path, {path, "/labels", "not found"});
}

TEST(Hdf5DatasetTest, ImagesIsAGroup) {
  TempDir dir;
  const std::string path = dir.File("group.h5");
  Hdf5Writer w(path);
  w.CreateGroup("/images");
  w.Close();
  ExpectOpenError(path, {path, "/images", "not a readable dataset"});
}

TEST(Hdf5DatasetTest, WrongImagesRank) {
  TempDir dir;
  const std::string path = dir.File("rank2.h5");
  const std::vector<uint8_t> img(8);
  const std::vector<int32_t> lab = {0, 1};
  WriteRaw(path, H5Elem::kU8, {2, 4}, img.data(), H5Elem::kI32, {2}, lab.data());
  ExpectOpenError(path, {path, "/images", "rank 2"});
}

TEST(Hdf5DatasetTest, WrongLabelsRank) {
  TempDir dir;
  const std::string path = dir.File("labrank.h5");
  const std::vector<uint8_t> img(8);
  const std::vector<int32_t> lab = {0, 1};
  WriteRaw(path, H5Elem::kU8, {2, 1, 2, 2}, img.data(), H5Elem::kI32, {2, 1}, lab.data());
  ExpectOpenError(path, {path, "/labels", "rank 2"});
}

TEST(Hdf5DatasetTest, WrongImagesDtype) {
  TempDir dir;
  const std::vector<int32_t> lab = {0, 1};
  {
    const std::string path = dir.File("i16.h5");
    const std::vector<int16_t> img(8);
    WriteRaw(path, H5Elem::kI16, {2, 1, 2, 2}, img.data(), H5Elem::kI32, {2}, lab.data());
    ExpectOpenError(path, {path, "/images", "int16", "expected uint8 or float32"});
  }
  {
    const std::string path = dir.File("f64.h5");
    const std::vector<double> img(8);
    WriteRaw(path, H5Elem::kF64, {2, 1, 2, 2}, img.data(), H5Elem::kI32, {2}, lab.data());
    ExpectOpenError(path, {path, "/images", "float64"});
  }
  {
    const std::string path = dir.File("i8.h5");
    const std::vector<int8_t> img(8);
    WriteRaw(path, H5Elem::kI8, {2, 1, 2, 2}, img.data(), H5Elem::kI32, {2}, lab.data());
    ExpectOpenError(path, {path, "/images", "int8"});
  }
}

TEST(Hdf5DatasetTest, FloatLabelsAreRejected) {
  TempDir dir;
  const std::string path = dir.File("flab.h5");
  const std::vector<uint8_t> img(8);
  const std::vector<float> lab = {0, 1};
  WriteRaw(path, H5Elem::kU8, {2, 1, 2, 2}, img.data(), H5Elem::kF32, {2}, lab.data());
  ExpectOpenError(path, {path, "/labels", "float32", "integer"});
}

TEST(Hdf5DatasetTest, SampleCountMismatch) {
  TempDir dir;
  const std::string path = dir.File("mismatch.h5");
  const std::vector<uint8_t> img(size_t{3} * 4);
  const std::vector<int32_t> lab = {0, 1};
  WriteRaw(path, H5Elem::kU8, {3, 1, 2, 2}, img.data(), H5Elem::kI32, {2}, lab.data());
  ExpectOpenError(path, {path, "/images has 3 samples but /labels has 2"});
}

TEST(Hdf5DatasetTest, ZeroSamples) {
  TempDir dir;
  const std::string path = dir.File("empty.h5");
  WriteRaw(path, H5Elem::kU8, {0, 1, 2, 2}, nullptr, H5Elem::kI32, {0}, nullptr);
  ExpectOpenError(path, {path, "/images", "N = 0"});
}

TEST(Hdf5DatasetTest, LabelOutOfRangeForModelClasses) {
  TempDir dir;
  const std::string path = dir.File("labels.h5");
  const std::vector<uint8_t> img(5);
  const std::vector<int32_t> lab = {0, 1, 9, 3, 12};
  WriteRaw(path, H5Elem::kU8, {5, 1, 1, 1}, img.data(), H5Elem::kI32, {5}, lab.data());
  EXPECT_NO_THROW(OpenHdf5Dataset(path, Mode("ram")));  // no class count known: only >= 0
  ExpectOpenError(path, {path, "/labels", "label 9 at index 2", "[0, 5)"}, Mode("ram", 5));
}

TEST(Hdf5DatasetTest, LabelOutOfRangeForFileClasses) {
  TempDir dir;
  const std::string path = dir.File("attr.h5");
  Hdf5Writer w(path);
  const std::vector<uint8_t> img(3);
  const std::vector<int64_t> lab = {0, 4, 1};
  w.WriteArray("/images", H5Elem::kU8, {3, 1, 1, 1}, img.data());
  w.WriteArray("/labels", H5Elem::kI64, {3}, lab.data());
  w.SetIntAttr("/", "classes", 3);
  w.Close();
  ExpectOpenError(path, {path, "/labels", "label 4 at index 1", "classes attribute"});
  // The model's class count takes precedence for the check.
  EXPECT_EQ(OpenHdf5Dataset(path, Mode("ram", 10))->info().classes, 3);
}

TEST(Hdf5DatasetTest, NegativeAndHugeLabels) {
  TempDir dir;
  const std::vector<uint8_t> img(3);
  {
    const std::string path = dir.File("neg.h5");
    const std::vector<int32_t> lab = {0, 1, -1};
    WriteRaw(path, H5Elem::kU8, {3, 1, 1, 1}, img.data(), H5Elem::kI32, {3}, lab.data());
    ExpectOpenError(path, {path, "/labels", "label -1 at index 2"});
  }
  {
    const std::string path = dir.File("huge.h5");
    const std::vector<int64_t> lab = {0, int64_t{1} << 40, 1};
    WriteRaw(path, H5Elem::kU8, {3, 1, 1, 1}, img.data(), H5Elem::kI64, {3}, lab.data());
    ExpectOpenError(path, {path, "/labels", "label 1099511627776 at index 1"});
  }
}

TEST(Hdf5DatasetTest, BadClassesAttribute) {
  TempDir dir;
  const std::string path = dir.File("badattr.h5");
  Hdf5Writer w(path);
  const std::vector<uint8_t> img(1);
  const std::vector<int32_t> lab = {0};
  w.WriteArray("/images", H5Elem::kU8, {1, 1, 1, 1}, img.data());
  w.WriteArray("/labels", H5Elem::kI32, {1}, lab.data());
  w.SetIntAttr("/", "classes", 0);
  w.Close();
  ExpectOpenError(path, {path, "/labels", "classes", "not a positive integer"});
}

TEST(Hdf5DatasetTest, NonFinitePixels) {
  TempDir dir;
  const std::vector<int32_t> lab = {0, 1, 0};
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const std::string path = dir.File("nan.h5");
    std::vector<float> img(size_t{3} * 4, 0.5f);
    img[2 * 4 + 1] = bad;
    WriteRaw(path, H5Elem::kF32, {3, 1, 2, 2}, img.data(), H5Elem::kI32, {3}, lab.data(), 1);
    for (const char* mode : {"ram", "chunks"}) {
      ExpectOpenError(path, {path, "/images", "non-finite", "sample 2"}, Mode(mode));
    }
  }
}

TEST(Hdf5DatasetTest, BadMeanAttribute) {
  TempDir dir;
  const std::string path = dir.File("mean.h5");
  Hdf5Writer w(path);
  const std::vector<uint8_t> img(size_t{2} * 3);
  const std::vector<int32_t> lab = {0, 1};
  w.WriteArray("/images", H5Elem::kU8, {2, 3, 1, 1}, img.data());
  w.WriteArray("/labels", H5Elem::kI32, {2}, lab.data());
  w.SetFloatsAttr("/", "mean", {0.1f, 0.2f});  // 2 values for 3 channels
  w.Close();
  ExpectOpenError(path, {path, "/images", "mean", "1 or C = 3"});
}

TEST(Hdf5DatasetTest, WriterRejectsBadInput) {
  TempDir dir;
  const std::string path = dir.File("w.h5");
  const std::vector<uint8_t> img(4);
  const std::vector<int32_t> lab = {0, 5};
  EXPECT_THROW(WriteHdf5Dataset(path, img.data(), Shape({2, 1, 1, 2}), lab.data(), 3), DataError);
  EXPECT_THROW(WriteHdf5Dataset(path, img.data(), Shape({0, 1, 1, 2}), lab.data(), 3), DataError);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_THROW(WriteHdf5Dataset(dir.File("no/such/dir/x.h5"), img.data(), Shape({2, 1, 1, 2}),
                                lab.data(), 6),
               IoError);
}

TEST(Hdf5DatasetTest, MemoryDataset) {
  std::vector<float> img = {1, 2, 3, 4, 5, 6};
  auto ds = MakeMemoryDataset(img, {1, 0, 1}, Shape({1, 2, 1}));
  EXPECT_EQ(ds->info().size, 3);
  const std::vector<int64_t> idx = {2, 0};
  std::vector<float> out(4);
  std::vector<int32_t> l(2);
  ds->Read(idx.data(), 2, out.data(), l.data());
  EXPECT_EQ(out, (std::vector<float>{5, 6, 1, 2}));
  EXPECT_EQ(l, (std::vector<int32_t>{1, 1}));
  EXPECT_THROW(MakeMemoryDataset({1, 2, 3}, {0, 1}, Shape({1, 2, 1})), DataError);
}

}  // namespace
}  // namespace dptrain
