// SPDX-License-Identifier: Apache-2.0
// The run_dir lock: one holder at a time (a second one, even in this process, is refused naming
// the first), released when the holder goes, and a failed setup leaves no file of its own.
#include "runtime/run_dir_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "tests/testing/temp_dir.h"

namespace dptrain {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(RunDirLockTest, SecondHolderIsRefusedNamingTheFirst) {
  testing::TempDir dir;
  RunDirLock first;
  std::string why;
  ASSERT_TRUE(first.Acquire(dir.path(), "pid 1 on a", &why)) << why;
  EXPECT_TRUE(first.held());
  EXPECT_EQ(ReadAll(dir.File(".dptrain.lock")), "pid 1 on a\n");
  EXPECT_TRUE(first.Acquire(dir.path(), "again", &why));  // holding already: no change
  RunDirLock second;
  try {
    second.Acquire(dir.path(), "pid 2 on b", &why);
    FAIL() << "a second holder was let in";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("run_dir '" + dir.path() +
                                    "' is in use by another dptrain run (pid 1 on a)"));
  }
  EXPECT_FALSE(second.held());
  EXPECT_EQ(ReadAll(dir.File(".dptrain.lock")), "pid 1 on a\n");  // the holder's note stays
}

TEST(RunDirLockTest, HoldingOneDirectoryAndAskingForAnotherIsAnInternalError) {
  testing::TempDir a, b;
  RunDirLock lock;
  std::string why;
  ASSERT_TRUE(lock.Acquire(a.path(), "pid 1", &why)) << why;
  EXPECT_THROW(lock.Acquire(b.path(), "pid 1", &why), InternalError);
  EXPECT_FALSE(std::filesystem::exists(b.File(".dptrain.lock")));
  lock.Abandon();
  ASSERT_TRUE(lock.Acquire(b.path(), "pid 1", &why)) << why;  // free again after Abandon
}

TEST(RunDirLockTest, ReleasedWhenTheHolderGoesAndTheFileIsReused) {
  testing::TempDir dir;
  std::string why;
  {
    RunDirLock first;
    ASSERT_TRUE(first.Acquire(dir.path(), "a much longer note from the first run", &why));
  }
  EXPECT_TRUE(std::filesystem::exists(dir.File(".dptrain.lock")));  // a note, not a lock
  RunDirLock next;
  ASSERT_TRUE(next.Acquire(dir.path(), "pid 3 on c", &why)) << why;
  EXPECT_EQ(ReadAll(dir.File(".dptrain.lock")), "pid 3 on c\n");  // the old note is gone
}

TEST(RunDirLockTest, AbandonRemovesOnlyAFileItCreated) {
  testing::TempDir dir;
  std::string why;
  RunDirLock fresh;
  ASSERT_TRUE(fresh.Acquire(dir.path(), "pid 4 on d", &why));
  fresh.Abandon();
  EXPECT_FALSE(fresh.held());
  EXPECT_FALSE(std::filesystem::exists(dir.File(".dptrain.lock")));

  std::ofstream(dir.File(".dptrain.lock")) << "pid 5 on e\n";  // left by an earlier run
  RunDirLock reused;
  ASSERT_TRUE(reused.Acquire(dir.path(), "pid 6 on f", &why));
  reused.Abandon();
  EXPECT_TRUE(std::filesystem::exists(dir.File(".dptrain.lock")));
  RunDirLock after;  // abandoned means unlocked
  EXPECT_TRUE(after.Acquire(dir.path(), "pid 7 on g", &why));
}

TEST(RunDirLockTest, AMissingDirectoryIsNotLockedAndSaysWhy) {
  testing::TempDir dir;
  RunDirLock lock;
  std::string why;
  EXPECT_FALSE(lock.Acquire(dir.File("absent"), "pid 8 on h", &why));
  EXPECT_FALSE(lock.held());
  EXPECT_THAT(why, HasSubstr(dir.File("absent") + "/.dptrain.lock: No such file"));
}

}  // namespace
}  // namespace dptrain
