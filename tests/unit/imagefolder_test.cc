// SPDX-License-Identifier: Apache-2.0
// convert --from imagefolder, the pure logic: torchvision's Resize(S) + CenterCrop(S) geometry,
// shard planning and names, --shard-size parsing, the folder listing (order, labels, what is
// a sample) and the command line checks. Pixels against PIL: tests/integration/
// imagefolder_convert.sh.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/memory/caching_allocator.h"
#include "datasets/convert/convert.h"
#include "launcher/convert_command.h"
#include "tests/testing/hdf5_files.h"
#include "tests/testing/temp_dir.h"

namespace dptrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteBytes;

TEST(ImageFolderGeometryTest, ShorterSideBecomesSizeLongerIsTruncated) {
  // torchvision: int(S * long / short).
  ImageFolderGeometry g = ResizeCropGeometry(300, 200, 32);
  EXPECT_EQ(g.resized_w, 48);
  EXPECT_EQ(g.resized_h, 32);
  g = ResizeCropGeometry(37, 100, 32);  // 32 * 100 / 37 = 86.49
  EXPECT_EQ(g.resized_w, 32);
  EXPECT_EQ(g.resized_h, 86);
  g = ResizeCropGeometry(20, 28, 32);  // enlarged: 32 * 28 / 20 = 44.8
  EXPECT_EQ(g.resized_w, 32);
  EXPECT_EQ(g.resized_h, 44);
  g = ResizeCropGeometry(50, 50, 32);
  EXPECT_EQ(g.resized_w, 32);
  EXPECT_EQ(g.resized_h, 32);
  EXPECT_EQ(g.crop_x, 0);
  EXPECT_EQ(g.crop_y, 0);
  // 224 * 333 / 500 = 149.18; 256 * 640 / 480 = 341.33
  EXPECT_EQ(ResizeCropGeometry(500, 333, 224).resized_w, 336);
  EXPECT_EQ(ResizeCropGeometry(640, 480, 256).resized_w, 341);
}

TEST(ImageFolderGeometryTest, CropOffsetRoundsHalfToEvenAsPython) {
  // int(round((side - S) / 2.0)): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4.
  EXPECT_EQ(ResizeCropGeometry(33, 32, 32).crop_x, 0);
  EXPECT_EQ(ResizeCropGeometry(35, 32, 32).crop_x, 2);
  EXPECT_EQ(ResizeCropGeometry(37, 32, 32).crop_x, 2);
  EXPECT_EQ(ResizeCropGeometry(39, 32, 32).crop_x, 4);
  EXPECT_EQ(ResizeCropGeometry(32, 40, 32).crop_y, 4);
  EXPECT_EQ(ResizeCropGeometry(300, 200, 32).crop_x, 8);  // 48 - 32 = 16
}

TEST(ImageFolderShardsTest, PlansConsecutiveShardsOfWholeSamples) {
  const std::vector<ShardRange> one = PlanShards(10, 3072, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].first, 0);
  EXPECT_EQ(one[0].count, 10);
  const std::vector<ShardRange> p = PlanShards(10, 3072, 10000);  // 3 samples a shard
  ASSERT_EQ(p.size(), 4u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p[i].first, static_cast<int64_t>(3 * i));
    EXPECT_EQ(p[i].count, 3);
  }
  EXPECT_EQ(p[3].first, 9);
  EXPECT_EQ(p[3].count, 1);
  EXPECT_EQ(PlanShards(6, 3072, 3072 * 3).size(), 2u);  // exactly full shards
  EXPECT_EQ(PlanShards(1, 3072, 3072).size(), 1u);
  EXPECT_THROW(PlanShards(10, 3072, 3071), ConfigError);
}

TEST(ImageFolderShardsTest, ShardNames) {
  EXPECT_EQ(ImageFolderShardPath("train.h5", 0, false), "train.h5");
  EXPECT_EQ(ImageFolderShardPath("train.h5", 0, true), "train-00000.h5");
  EXPECT_EQ(ImageFolderShardPath("d/train", 12, true), "d/train-00012.h5");
  EXPECT_EQ(ImageFolderShardPath("x.hdf5", 1, true), "x.hdf5-00001.h5");
}

TEST(ImageFolderShardsTest, ShardSizeSuffixes) {
  // --shard-size goes through ParseByteSize, as memory.limit does.
  EXPECT_EQ(ParseByteSize("10GB", "--shard-size"), size_t{10000000000});
  EXPECT_EQ(ParseByteSize("10KB", "--shard-size"), size_t{10000});
  EXPECT_EQ(ParseByteSize("2MB", "--shard-size"), size_t{2000000});
  EXPECT_EQ(ParseByteSize("1KiB", "--shard-size"), size_t{1024});
  EXPECT_EQ(ParseByteSize("3MiB", "--shard-size"), size_t{3} << 20);
  EXPECT_EQ(ParseByteSize("1GiB", "--shard-size"), size_t{1} << 30);
  EXPECT_EQ(ParseByteSize("512B", "--shard-size"), size_t{512});
  EXPECT_EQ(ParseByteSize("4096", "--shard-size"), size_t{4096});
  EXPECT_THROW(ParseByteSize("10XB", "--shard-size"), ConfigError);
  EXPECT_THROW(ParseByteSize("-1GB", "--shard-size"), ConfigError);
}

// An image folder of empty files (listing never decodes).
class ImageFolderListTest : public ::testing::Test {
 protected:
  void Touch(const std::string& rel) {
    const std::filesystem::path p = std::filesystem::path(dir_.path()) / rel;
    std::filesystem::create_directories(p.parent_path());
    WriteBytes(p.string(), "x");
  }
  TempDir dir_;
};

TEST_F(ImageFolderListTest, TorchvisionOrderAndLabels) {
  Touch("b/2.jpg");
  Touch("b/10.JPG");
  Touch("b/sub/a.png");
  Touch("b/sub-2/a.png");
  Touch("b/a.jpeg");
  Touch("b/notes.txt");  // not an image extension: ignored
  Touch("B/x.bmp");      // torchvision's extension: a sample (unreadable for dptrain)
  Touch("a/z.png");
  Touch("loose.jpg");  // beside the class folders: ignored
  const ImageFolderListing l = ListImageFolder(dir_.path());
  EXPECT_THAT(l.classes, ElementsAre("B", "a", "b"));  // byte order: upper case first
  // Directories by path ("b" < "b/sub" < "b/sub-2"), then files by name.
  EXPECT_THAT(l.files, ElementsAre("B/x.bmp", "a/z.png", "b/10.JPG", "b/2.jpg", "b/a.jpeg",
                                   "b/sub/a.png", "b/sub-2/a.png"));
  EXPECT_THAT(l.labels, ElementsAre(0, 1, 2, 2, 2, 2, 2));
  EXPECT_THAT(l.bytes, ElementsAre(1, 1, 1, 1, 1, 1, 1));
}

TEST_F(ImageFolderListTest, EmptyFoldersAreErrorsNamingThem) {
  try {
    ListImageFolder(dir_.path());
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir_.path() + ": no class folders"));
  }
  Touch("a/1.jpg");
  std::filesystem::create_directories(dir_.File("b"));
  Touch("c/readme.txt");
  try {
    ListImageFolder(dir_.path());
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir_.File("b") + ", " + dir_.File("c") + ": no images"));
  }
  EXPECT_THROW(ListImageFolder(dir_.File("missing")), IoError);
}

TEST_F(ImageFolderListTest, ClassNameWithNewlineIsRejected) {
  Touch("a\nb/1.jpg");
  try {
    ListImageFolder(dir_.path());
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("may not contain a newline"));
  }
}

TEST(ImageFolderCommandTest, OptionsAreChecked) {
  ConvertArgs a;
  a.from = "imagefolder";
  a.out = "/nonexistent/x.h5";
  EXPECT_THROW(RunConvertCommand(a), ConfigError);  // no --input, no --size
  a.input = "/nonexistent";
  EXPECT_THROW(RunConvertCommand(a), ConfigError);  // no --size
  a.size = 32;
  a.shard_size = "lots";
  EXPECT_THROW(RunConvertCommand(a), ConfigError);
  a.shard_size.clear();
  a.threads = -1;
  EXPECT_THROW(RunConvertCommand(a), ConfigError);
  ConvertArgs idx;
  idx.from = "idx";
  idx.images = idx.labels = "x";
  idx.out = "/nonexistent/x.h5";
  idx.skip_bad = true;
  EXPECT_THROW(RunConvertCommand(idx), ConfigError);
}

}  // namespace
}  // namespace dptrain
