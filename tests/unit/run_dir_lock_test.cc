// SPDX-License-Identifier: Apache-2.0
// The run_dir lock: one holder at a time (a second one, even in this process, is refused naming
// the first), released when the holder goes, and a failed setup leaves no file of its own.
#include "runtime/run_dir_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

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

// Two runs starting while a third abandons its setup: a run that opened the file just before the
// abandoning one removed it must not end up holding the removed file while a later run locks a
// new one, nor take the file's disappearance for a file system that cannot lock.
TEST(RunDirLockTest, AFileRemovedWhileAnotherRunLocksItIsNotHeldTwice) {
  testing::TempDir dir;
  std::atomic<int> holders{0};
  std::atomic<int> twice{0};
  std::atomic<int> unlocked{0};
  std::atomic<int> held{0};
  auto run = [&] {
    for (int i = 0; i < 20000; ++i) {
      RunDirLock lock;
      std::string why;
      try {
        if (!lock.Acquire(dir.path(), "stress", &why)) {
          ++unlocked;
          continue;
        }
      } catch (const ConfigError&) {
        continue;  // the other thread holds it: refused, as it should be
      }
      ++held;
      if (holders.fetch_add(1) != 0) ++twice;
      std::this_thread::yield();
      holders.fetch_sub(1);
      lock.Abandon();
    }
  };
  std::vector<std::thread> threads(3);
  for (auto& t : threads) t = std::thread(run);
  for (auto& t : threads) t.join();
  EXPECT_EQ(twice.load(), 0) << "two holders at once";
  EXPECT_EQ(unlocked.load(), 0) << "a removed file taken for a file system without locks";
  EXPECT_GT(held.load(), 0);
}

}  // namespace
}  // namespace dptrain
