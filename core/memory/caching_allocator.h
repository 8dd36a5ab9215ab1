// SPDX-License-Identifier: Apache-2.0
// The caching allocator every tensor of the runtime goes through (one per device). Freed blocks
// are kept in size bins and reused; statistics (in use, reserved, peak, allocations, OOMs) and an
// optional byte budget make out-of-memory reproducible on CPU and explainable on GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace dptrain {

// The device's own allocation functions. Alloc returns nullptr when the device is full.
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  virtual void* Alloc(size_t bytes) noexcept = 0;
  virtual void Free(void* ptr) noexcept = 0;
  virtual Device device() const = 0;
  // Physical capacity in bytes (0 = unknown).
  virtual size_t Capacity() const { return 0; }

  // Streams (CUDA). RecordFence marks the end of the work queued on `stream` so far (an event)
  // and returns it, nullptr when there is nothing to wait for; FenceDone polls it without
  // blocking; DestroyFence frees it. Host memory has no streams: everything is done at once.
  virtual void* RecordFence(void* /*stream*/) noexcept { return nullptr; }
  virtual bool FenceDone(void* /*fence*/) noexcept { return true; }
  virtual void DestroyFence(void* /*fence*/) noexcept {}
};

struct MemoryStats {
  size_t in_use = 0;    // bytes held by live buffers (rounded block sizes)
  size_t reserved = 0;  // in_use + cached free blocks: what the device sees
  size_t peak_in_use = 0;
  size_t peak_reserved = 0;
  int64_t num_allocs = 0;         // Allocate() calls that returned memory
  int64_t num_device_allocs = 0;  // of those, how many went to the device (cache misses)
  int64_t num_ooms = 0;
};

class CachingAllocator {
 public:
  // budget = 0: no limit beyond the device itself.
  explicit CachingAllocator(std::unique_ptr<RawAllocator> raw, size_t budget = 0);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (64-byte aligned). On failure frees the cache and retries once,
  // then throws OutOfMemory with a report naming `label`. Thread-safe.
  std::shared_ptr<Buffer> Allocate(size_t bytes, std::string_view label);
  // Gives every cached (free) block back to the device.
  void EmptyCache();
  MemoryStats stats() const;
  void ResetPeak();
  void set_budget(size_t bytes);
  size_t budget() const { return budget_; }
  Device device() const { return raw_->device(); }
  // The device's physical capacity in bytes (0 = unknown, e.g. host memory).
  size_t Capacity() const { return raw_->Capacity(); }
  // Multi-line description of the state: stats, budget, the largest live buffers.
  std::string Report(size_t top = 5) const;

  // Called by ~Buffer.
  void Release(void* ptr, size_t bytes) noexcept;

  // Stream-aware reuse (as PyTorch's recordStream): the live block at `ptr` is also used by
  // work queued on `stream`, another stream than the one this allocator's blocks are handed out
  // to (e.g. NCCL's communication stream). When the block is released, a fence is recorded on
  // each such stream and the block is handed out again only once they have all passed, so no
  // new tensor is written while a collective may still read the old one. Called by
  // Buffer::RecordStream.
  void RecordStream(void* ptr, void* stream);
  // The work queued on `stream` so far ends the live block's use there (an asynchronous
  // collective just enqueued on it): a fence is recorded now, and at release the block waits for
  // that fence, not for one recorded then. Work queued on the stream later (the next gradient
  // group's reduce-scatter) then no longer keeps the block from being reused. A later
  // RecordStream or FenceStreamUse on the same stream extends the use. Called by
  // Buffer::FenceStreamUse.
  void FenceStreamUse(void* ptr, void* stream);
  // `stream` is about to be destroyed (a communicator going away). Every live block that records
  // it gets a fence recorded now, while the handle is still valid, and forgets the handle: the
  // driver recycles stream handles, so a fence recorded later could land on an unrelated stream.
  // No work can be queued on a destroyed stream, so that fence covers all of it.
  void ForgetStream(void* stream) noexcept;

  // Rounds a request to the block size actually reserved for it.
  static size_t RoundSize(size_t bytes);

 private:
  void* AllocLocked(size_t block);
  // wait_for_streams: first wait for other streams' fenced work (cudaFree would anyway).
  void EmptyCacheLocked(bool wait_for_streams = true);
  void ReclaimPendingLocked();     // fenced blocks whose fences passed -> free_blocks_
  bool FencesOutstandingLocked();  // other streams' fenced work not yet done
  std::string ReportLockedUnsafe(size_t top) const;  // mu_ held

  std::unique_ptr<RawAllocator> raw_;
  size_t budget_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_blocks_;  // size -> ptr
  struct Live {
    size_t bytes;
    std::string label;
    std::vector<void*> streams;  // other streams that use the block (RecordStream)
    std::vector<void*> fences;   // recorded by ForgetStream on streams since destroyed
    std::vector<std::pair<void*, void*>> used_until;  // (stream, fence) of FenceStreamUse
  };
  std::unordered_map<void*, Live> live_;
  struct Pending {  // released, but other streams may still use it
    size_t bytes;
    void* ptr;
    std::vector<void*> fences;
  };
  std::vector<Pending> pending_;
  MemoryStats stats_;
};

// Names what this thread's allocations are for while it lives, e.g. the layer being set up, so
// that buffer labels and out-of-memory reports read "conv2d staged dy (layer conv2)". Scopes
// nest; the innermost one names the allocations.
class AllocationScope {
 public:
  explicit AllocationScope(std::string what);
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;
  // The innermost scope's name on this thread; empty outside any scope.
  static const std::string& Current();
};

// Parses "512MiB", "2GiB", "1.5GB", "1048576" into bytes (at least 1); nullopt with `why` set
// ("is not a positive size", "is less than one byte", "is too large"; `why` is not null) when
// it is not one.
std::optional<size_t> TryParseByteSize(std::string_view text, std::string* why);
// ParseByteSize, throwing ConfigError "<what>: '<text>' <why> (examples: ...)".
size_t ParseByteSize(std::string_view text, std::string_view what);
std::string FormatBytes(size_t bytes);  // "1.50 GiB"

}  // namespace dptrain
