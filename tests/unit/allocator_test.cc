// SPDX-License-Identifier: Apache-2.0
// Caching allocator: reuse, statistics, EmptyCache, the budget, the OOM report, no leak.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "runtime/error.h"
#include "runtime/memory/caching_allocator.h"

namespace dptrain {
namespace {

using ::testing::HasSubstr;

class CountingRaw final : public RawAllocator {
 public:
  void* Alloc(size_t bytes) noexcept override {
    ++allocs;
    return std::aligned_alloc(64, bytes);
  }
  void Free(void* p) noexcept override {
    ++frees;
    std::free(p);
  }
  Device device() const override { return Device::kCpu; }
  int allocs = 0, frees = 0;
};

TEST(AllocatorTest, ReusesFreedBlocks) {
  auto raw = std::make_unique<CountingRaw>();
  CountingRaw* r = raw.get();
  CachingAllocator a(std::move(raw));
  void* first = nullptr;
  {
    auto b = a.Allocate(1000, "x");
    first = b->data();
  }
  auto b2 = a.Allocate(900, "y");  // same rounded bin
  EXPECT_EQ(b2->data(), first);
  EXPECT_EQ(r->allocs, 1);
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.num_allocs, 2);
  EXPECT_EQ(s.num_device_allocs, 1);
  EXPECT_EQ(s.in_use, CachingAllocator::RoundSize(1000));
}

TEST(AllocatorTest, StatisticsAndEmptyCache) {
  auto raw = std::make_unique<CountingRaw>();
  CountingRaw* r = raw.get();
  CachingAllocator a(std::move(raw));
  {
    auto x = a.Allocate(4 << 20, "x");
    auto y = a.Allocate(1 << 10, "y");
    EXPECT_EQ(a.stats().in_use, (4u << 20) + 1024u);
  }
  MemoryStats s = a.stats();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.reserved, (4u << 20) + 1024u);
  EXPECT_EQ(s.peak_in_use, (4u << 20) + 1024u);
  a.EmptyCache();
  s = a.stats();
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(r->frees, 2);
}

TEST(AllocatorTest, BudgetBehavesLikeAFullDeviceAndReportsTheCulprit) {
  CachingAllocator a(std::make_unique<CountingRaw>(), 1 << 20);
  auto keep = a.Allocate(700 << 10, "conv1 output");
  { auto cached = a.Allocate(200 << 10, "temporary"); }
  // 700K live + 200K cached; 300K more does not fit until the cache is emptied -> succeeds.
  auto fits = a.Allocate(300 << 10, "after retry");
  EXPECT_EQ(a.stats().num_ooms, 0);
  try {
    auto too_big = a.Allocate(512 << 10, "fc1 weight gradient");
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.exit_code(), 4);
    EXPECT_THAT(e.what(), HasSubstr("fc1 weight gradient"));
    EXPECT_THAT(e.what(), HasSubstr("memory.limit"));
    EXPECT_THAT(e.what(), HasSubstr("conv1 output"));
  }
  EXPECT_EQ(a.stats().num_ooms, 1);
}

TEST(AllocatorTest, SteadyStateDoesNotGrow) {
  CachingAllocator a(std::make_unique<CountingRaw>());
  size_t in_use_after_first = 0;
  for (int step = 0; step < 1000; ++step) {
    auto x = a.Allocate(123456, "act");
    auto y = a.Allocate(777, "small");
    x.reset();
    auto z = a.Allocate(100000, "reuses x");
    if (step == 0) in_use_after_first = a.stats().reserved;
  }
  EXPECT_EQ(a.stats().in_use, 0u);
  EXPECT_EQ(a.stats().reserved, in_use_after_first);
}

TEST(AllocatorTest, ParsesByteSizes) {
  EXPECT_EQ(ParseByteSize("512MiB", "memory.limit"), 512u << 20);
  EXPECT_EQ(ParseByteSize("2GiB", "memory.limit"), 2ull << 30);
  EXPECT_EQ(ParseByteSize("1.5 GB", "memory.limit"), 1500000000u);
  EXPECT_EQ(ParseByteSize("4096", "memory.limit"), 4096u);
  EXPECT_THROW(ParseByteSize("lots", "memory.limit"), ConfigError);
  EXPECT_THROW(ParseByteSize("-1GiB", "memory.limit"), ConfigError);
  EXPECT_THROW(ParseByteSize("3 parsecs", "memory.limit"), ConfigError);
}

}  // namespace
}  // namespace dptrain
