// SPDX-License-Identifier: Apache-2.0
// Datasets of several files (data.train as a list or a glob): global indices across the files,
// pattern expansion, class names, and a clear error for each way the files can disagree.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "datasets/dataset.h"
#include "datasets/hdf5_writer.h"
#include "tests/testing/hdf5_files.h"
#include "tests/unit/hdf5_dataset_test_util.h"

namespace dptrain {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

// A file of n samples of shape (1, 2, 2) whose pixels encode `first + i` (the global index).
void WriteShard(const std::string& path, int64_t first, int64_t n, int64_t classes = 5,
                const std::string& class_names = "", int64_t h = 2) {
  std::vector<uint8_t> img(static_cast<size_t>(n * 2 * h));
  std::vector<int32_t> lab(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < 2 * h; ++j)
      img[static_cast<size_t>(i * 2 * h + j)] = static_cast<uint8_t>(first + i);
    lab[static_cast<size_t>(i)] = static_cast<int32_t>((first + i) % classes);
  }
  Hdf5Writer w(path);
  w.WriteArray("/images", H5Elem::kU8, {n, 1, h, 2}, img.data(), 1);
  w.WriteArray("/labels", H5Elem::kI32, {n}, lab.data());
  w.SetIntAttr("/", "classes", classes);
  if (!class_names.empty()) w.SetStringAttr("/", "class_names", class_names);
  w.Close();
}

void ExpectError(const std::vector<std::string>& entries, const std::vector<std::string>& parts) {
  try {
    OpenHdf5Datasets(entries, OpenOptions());
    ADD_FAILURE() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(e.exit_code(), kExitData);
    for (const std::string& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

TEST(MultiFileDatasetTest, IndicesRunOverTheFilesInOrder) {
  TempDir dir;
  // Written out of name order: a glob reads them sorted by name.
  WriteShard(dir.File("train-00001.h5"), 3, 4);
  WriteShard(dir.File("train-00000.h5"), 0, 3);
  WriteShard(dir.File("train-00002.h5"), 7, 2);
  for (const char* mode : {"ram", "chunks"}) {
    for (const auto& entries :
         {std::vector<std::string>{dir.File("train-*.h5")},
          std::vector<std::string>{dir.File("train-00000.h5"), dir.File("train-0000[12].h5")}}) {
      const auto ds = OpenHdf5Datasets(entries, Mode(mode));
      EXPECT_EQ(ds->info().size, 9);
      EXPECT_EQ(ds->info().sample_shape, Shape({1, 2, 2}));
      EXPECT_EQ(ds->info().classes, 5);
      EXPECT_THAT(ds->info().path, HasSubstr("train-00000.h5 (+2 more files)"));
      const std::vector<int64_t> idx = {8, 0, 3, 6, 2, 7, 3};
      std::vector<float> img(idx.size() * 4);
      std::vector<int32_t> lab(idx.size());
      ds->Read(idx.data(), static_cast<int64_t>(idx.size()), img.data(), lab.data());
      for (size_t k = 0; k < idx.size(); ++k) {
        EXPECT_EQ(lab[k], idx[k] % 5) << mode;
        EXPECT_EQ(img[k * 4 + 3], static_cast<float>(idx[k]) / 255.f)
            << mode << " index " << idx[k];
      }
      // All from one file (the fast path).
      const std::vector<int64_t> one = {5, 4};
      ds->Read(one.data(), 2, img.data(), lab.data());
      EXPECT_EQ(img[0], 5.f / 255.f);
      EXPECT_EQ(img[4], 4.f / 255.f);
    }
  }
  // One entry naming one file is that file's own dataset.
  EXPECT_EQ(OpenHdf5Datasets({dir.File("train-00002.h5")}, OpenOptions())->info().path,
            dir.File("train-00002.h5"));
}

TEST(MultiFileDatasetTest, ClassNamesComeFromTheFileAndMustAgree) {
  TempDir dir;
  WriteShard(dir.File("a.h5"), 0, 3, 3, "cat\ndog\nsnail");
  WriteShard(dir.File("b.h5"), 3, 3, 3, "cat\ndog\nsnail");
  const auto ds = OpenHdf5Datasets({dir.File("a.h5"), dir.File("b.h5")}, OpenOptions());
  EXPECT_EQ(ds->info().class_names, (std::vector<std::string>{"cat", "dog", "snail"}));
  WriteShard(dir.File("c.h5"), 6, 3, 3, "cat\ndog\nslug");
  ExpectError({dir.File("a.h5"), dir.File("c.h5")},
              {dir.File("c.h5"), "class names [cat, dog, slug] differ from", "[cat, dog, snail]"});
  // The names must count the file's classes.
  WriteShard(dir.File("d.h5"), 0, 3, 3, "cat\ndog");
  ExpectOpenError(dir.File("d.h5"),
                  {"class_names has 2 names but the file's classes attribute is 3"});
}

TEST(MultiFileDatasetTest, FilesThatDisagreeAreNamed) {
  TempDir dir;
  WriteShard(dir.File("a.h5"), 0, 3);
  WriteShard(dir.File("taller.h5"), 0, 3, 5, "", 3);
  ExpectError({dir.File("a.h5"), dir.File("taller.h5")},
              {dir.File("taller.h5"), "samples of shape [1, 3, 2] differ from", "[1, 2, 2]"});
  WriteShard(dir.File("seven.h5"), 0, 3, 7);
  ExpectError({dir.File("a.h5"), dir.File("seven.h5")}, {dir.File("seven.h5"), "classes = 7"});
  std::vector<float> f(12, 0.5f);
  WriteHdf5Dataset(dir.File("float.h5"), f.data(), Shape({3, 1, 2, 2}),
                   std::vector<int32_t>{0, 1, 2}.data(), 5);
  ExpectError({dir.File("a.h5"), dir.File("float.h5")}, {dir.File("float.h5"), "/images of type"});
}

TEST(MultiFileDatasetTest, PatternsAndListsAreChecked) {
  TempDir dir;
  WriteShard(dir.File("a.h5"), 0, 3);
  ExpectError({dir.File("a.h5"), dir.File("nothing-*.h5")},
              {"no file matches the pattern '" + dir.File("nothing-*.h5") + "'"});
  ExpectError({dir.File("a.h5"), dir.File("*.h5")}, {dir.File("a.h5"), "listed more than once"});
  // A missing file (no pattern) is the open's error, naming it.
  ExpectError({dir.File("a.h5"), dir.File("missing.h5")}, {dir.File("missing.h5")});
  EXPECT_EQ(ExpandDatasetPaths({dir.File("a.h5")}), std::vector<std::string>{dir.File("a.h5")});
}

}  // namespace
}  // namespace dptrain
