// SPDX-License-Identifier: Apache-2.0
// Caching allocator: reuse, statistics, EmptyCache, the budget, the OOM report, no leak.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <thread>

#include "core/error.h"
#include "core/memory/caching_allocator.h"

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

TEST(AllocatorTest, AllocationScopeNamesTheLayerInLabelsAndReports) {
  CachingAllocator a(std::make_unique<CountingRaw>(), 1 << 20);
  EXPECT_EQ(AllocationScope::Current(), "");
  std::shared_ptr<Buffer> keep;
  {
    const AllocationScope outer("block1");
    {
      const AllocationScope inner("conv2");
      keep = a.Allocate(700 << 10, "conv2d staged dy");
      EXPECT_EQ(keep->label(), "conv2d staged dy (layer conv2)");
    }
    EXPECT_EQ(AllocationScope::Current(), "block1");
    try {
      auto too_big = a.Allocate(512 << 10, "conv2d staged output");
      FAIL() << "expected OutOfMemory";
    } catch (const OutOfMemory& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("allocating 512.0 KiB for conv2d staged output (layer block1)"));
      EXPECT_THAT(e.what(), HasSubstr("conv2d staged dy (layer conv2)"));  // largest live
    }
  }
  EXPECT_EQ(AllocationScope::Current(), "");
  EXPECT_EQ(a.Allocate(64, "plain")->label(), "plain");
}

// A device with streams: fences are numbered; the test decides when each has passed, from
// another thread too (`done` is atomic, and a deque keeps each fence where it is). Counts the
// blocks given back and whether one was given back while a fence was pending.
class FencedRaw final : public RawAllocator {
 public:
  void* Alloc(size_t bytes) noexcept override { return std::aligned_alloc(64, bytes); }
  void Free(void* p) noexcept override {
    std::free(p);
    ++frees;
    for (const F& f : fences) freed_while_busy = freed_while_busy || !f.done.load();
  }
  Device device() const override { return Device::kCuda; }
  void* RecordFence(void* stream) noexcept override {
    fences.emplace_back(stream);
    return reinterpret_cast<void*>(fences.size());  // 1-based id
  }
  bool FenceDone(void* f) noexcept override { return Fence(f).done.load(); }
  void DestroyFence(void* f) noexcept override { Fence(f).destroyed = true; }
  struct F {
    explicit F(void* s) : stream(s) {}
    void* stream;
    std::atomic<bool> done{false};
    bool destroyed = false;
  };
  F& Fence(void* f) { return fences[reinterpret_cast<size_t>(f) - 1]; }
  std::deque<F> fences;
  int frees = 0;
  bool freed_while_busy = false;
};

TEST(AllocatorTest, BlocksUsedByAnotherStreamWaitForItsFence) {
  auto raw = std::make_unique<FencedRaw>();
  FencedRaw* r = raw.get();
  CachingAllocator a(std::move(raw));
  void* comm_stream = reinterpret_cast<void*>(0x5);
  void* old = nullptr;
  {
    auto bucket = a.Allocate(1 << 20, "gradient bucket");
    old = bucket->data();
    bucket->RecordStream(comm_stream);
    bucket->RecordStream(comm_stream);  // once per stream
  }
  ASSERT_EQ(r->fences.size(), 1u) << "one fence, on the stream that used the block";
  EXPECT_EQ(r->fences[0].stream, comm_stream);
  EXPECT_EQ(a.stats().in_use, 0u);
  EXPECT_EQ(a.stats().reserved, size_t{1} << 20) << "still reserved while fenced";
  auto next = a.Allocate(1 << 20, "activation");
  EXPECT_NE(next->data(), old) << "reused while the other stream may still read it";
  r->fences[0].done = true;
  auto again = a.Allocate(1 << 20, "activation");
  EXPECT_EQ(again->data(), old) << "reused once the fence passed";
  EXPECT_TRUE(r->fences[0].destroyed);
}

// A communicator's stream is destroyed while a tensor it used lives on (nccl_test's Split and
// MissingPeer cases). The fence must be recorded before the handle dies, never on the handle
// afterwards: the driver recycles handles, so a later fence could land on an unrelated stream.
TEST(AllocatorTest, ForgottenStreamIsFencedBeforeItIsDestroyed) {
  auto raw = std::make_unique<FencedRaw>();
  FencedRaw* r = raw.get();
  CachingAllocator a(std::move(raw));
  void* comm_stream = reinterpret_cast<void*>(0x5);
  void* other_stream = reinterpret_cast<void*>(0x6);
  auto survivor = a.Allocate(1 << 20, "bucket of a split communicator");
  auto untouched = a.Allocate(4096, "activation");
  void* old = survivor->data();
  survivor->RecordStream(comm_stream);
  survivor->RecordStream(other_stream);

  a.ForgetStream(comm_stream);  // ~NcclCommunicator, just before cudaStreamDestroy
  ASSERT_EQ(r->fences.size(), 1u) << "one fence, recorded while the stream still exists";
  EXPECT_EQ(r->fences[0].stream, comm_stream);
  const void* destroyed = comm_stream;  // from here on the handle may name another stream

  survivor.reset();
  untouched.reset();
  for (size_t i = 1; i < r->fences.size(); ++i) {
    EXPECT_NE(r->fences[i].stream, destroyed) << "fence recorded on a destroyed stream";
  }
  ASSERT_EQ(r->fences.size(), 2u) << "the live stream is fenced at release as before";
  EXPECT_EQ(r->fences[1].stream, other_stream);

  r->fences[1].done = true;
  auto held = a.Allocate(1 << 20, "next");
  EXPECT_NE(held->data(), old) << "the forgotten stream's work may still run";
  r->fences[0].done = true;
  EXPECT_EQ(a.Allocate(1 << 20, "next")->data(), old) << "reused once both fences passed";
  EXPECT_TRUE(r->fences[0].destroyed);
  EXPECT_TRUE(r->fences[1].destroyed);
  a.ForgetStream(comm_stream);  // nothing records it any more: no new fence
  EXPECT_EQ(r->fences.size(), 2u);
}

// Issue 63: dist.shard = "gradients" releases group g's scratch once its reduce-scatter is done,
// when group g+1's is already queued on the same NCCL stream. A fence recorded at release would
// wait for g+1's collective too, keeping a third group's scratch alive; the fence recorded just
// after g's collective (FenceStreamUse) lets the block go as soon as g's is done.
TEST(AllocatorTest, FencedUseEndsWithItsOwnCollective) {
  auto raw = std::make_unique<FencedRaw>();
  FencedRaw* r = raw.get();
  CachingAllocator a(std::move(raw));
  void* nccl = reinterpret_cast<void*>(0x5);
  auto g0 = a.Allocate(1 << 20, "gradients (group 0)");
  void* old = g0->data();
  g0->RecordStream(nccl);
  g0->FenceStreamUse(nccl);  // group 0's reduce-scatter enqueued: fence 1
  auto g1 = a.Allocate(1 << 20, "gradients (group 1)");
  g1->RecordStream(nccl);
  g1->FenceStreamUse(nccl);  // group 1's queued behind it: fence 2
  ASSERT_EQ(r->fences.size(), 2u);
  g0.reset();  // group 0 is done: released with its own fence, no new one
  EXPECT_EQ(r->fences.size(), 2u) << "a fence recorded at release would cover group 1 too";
  r->fences[0].done = true;  // group 0's collective has finished, group 1's has not
  auto g2 = a.Allocate(1 << 20, "gradients (group 2)");
  EXPECT_EQ(g2->data(), old) << "group 2 reuses group 0's block while group 1 still reduces";
  EXPECT_TRUE(r->fences[0].destroyed);

  // A second use on the same stream extends the first: the newer fence replaces the older.
  g2->RecordStream(nccl);
  g2->FenceStreamUse(nccl);  // fence 3
  g2->RecordStream(nccl);
  g2->FenceStreamUse(nccl);  // fence 4
  EXPECT_TRUE(r->fences[2].destroyed);
  g2.reset();
  r->fences[3].done = true;
  EXPECT_EQ(a.Allocate(1 << 20, "next")->data(), old);
  EXPECT_TRUE(r->fences[3].destroyed);
  g1.reset();  // still fenced by group 1's collective
  EXPECT_EQ(r->fences.size(), 4u);
  r->fences[1].done = true;  // done before the allocator goes: a fenced block would be leaked
}

// A stream used with a fence and then forgotten (the communicator destroyed): the fence stays.
TEST(AllocatorTest, ForgottenStreamKeepsTheFenceOfItsLastUse) {
  auto raw = std::make_unique<FencedRaw>();
  FencedRaw* r = raw.get();
  CachingAllocator a(std::move(raw));
  void* nccl = reinterpret_cast<void*>(0x5);
  auto b = a.Allocate(1 << 20, "bucket");
  void* old = b->data();
  b->RecordStream(nccl);
  b->FenceStreamUse(nccl);
  a.ForgetStream(nccl);
  EXPECT_EQ(r->fences.size(), 1u) << "no new fence: the use was already fenced";
  b.reset();
  auto held = a.Allocate(1 << 20, "x");
  EXPECT_NE(held->data(), old);
  r->fences[0].done = true;
  EXPECT_EQ(a.Allocate(1 << 20, "y")->data(), old);
}

// Issue 63: emptying the cache frees device memory (cudaFree), which waits for the whole
// device; with a collective in flight it would block behind it. The cache is not emptied until
// the other streams' fenced work is done.
TEST(AllocatorTest, CacheIsNotEmptiedWhileACollectiveIsInFlight) {
  auto raw = std::make_unique<FencedRaw>();
  FencedRaw* r = raw.get();
  CachingAllocator a(std::move(raw));
  void* nccl = reinterpret_cast<void*>(0x5);
  auto bucket = a.Allocate(1 << 20, "gradient group");
  bucket->RecordStream(nccl);
  bucket->FenceStreamUse(nccl);  // its reduce-scatter is queued
  a.Allocate(4096, "cached");    // released at once: a cached free block
  ASSERT_EQ(r->fences.size(), 1u);
  std::thread collective([r] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    r->fences[0].done = true;
  });
  const auto start = std::chrono::steady_clock::now();
  a.EmptyCache();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  collective.join();
  EXPECT_GE(waited, 0.09) << "emptied while the collective ran";
  EXPECT_EQ(r->frees, 1);
  EXPECT_FALSE(r->freed_while_busy);
}

TEST(AllocatorTest, BlocksWithoutOtherStreamsNeedNoFence) {
  auto raw = std::make_unique<FencedRaw>();
  FencedRaw* r = raw.get();
  CachingAllocator a(std::move(raw));
  void* old = nullptr;
  { old = a.Allocate(4096, "x")->data(); }
  EXPECT_EQ(a.Allocate(4096, "y")->data(), old);
  EXPECT_TRUE(r->fences.empty());
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
  std::string why;
  EXPECT_EQ(TryParseByteSize("lots", &why), std::nullopt);
  EXPECT_EQ(why, "is not a positive size");
  EXPECT_EQ(TryParseByteSize("0.5", &why), std::nullopt);
  EXPECT_EQ(why, "is less than one byte");
  EXPECT_EQ(TryParseByteSize("99999999 TiB", &why), std::nullopt);
  EXPECT_EQ(why, "is too large");
  EXPECT_EQ(TryParseByteSize("1 KiB", &why), std::optional<size_t>(1024));
  // Under one byte it would truncate to 0, which means "no limit".
  EXPECT_THROW(ParseByteSize("0.5", "memory.limit"), ConfigError);
  EXPECT_THROW(ParseByteSize("0.0001KiB", "memory.limit"), ConfigError);
  EXPECT_EQ(ParseByteSize("1.5", "memory.limit"), 1u);
  // Found by fuzz_config: a size beyond size_t was an undefined conversion.
  EXPECT_THROW(ParseByteSize("2555555555555555555555555GiB", "memory.limit"), ConfigError);
  EXPECT_THROW(ParseByteSize("1e300", "memory.limit"), ConfigError);
  EXPECT_EQ(ParseByteSize("1TiB", "memory.limit"), 1ull << 40);
}

}  // namespace
}  // namespace dptrain
