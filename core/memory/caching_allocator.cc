// SPDX-License-Identifier: Apache-2.0
// Size-binned caching allocator. Blocks are never split: a request takes the smallest cached
// block of at least its rounded size and at most twice it, so reuse is exact for the steady state
// of training (the same shapes every step) and fragmentation stays bounded.
#include "core/memory/caching_allocator.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace dptrain {

CachingAllocator::CachingAllocator(std::unique_ptr<RawAllocator> raw, size_t budget)
    : raw_(std::move(raw)), budget_(budget) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked(/*wait_for_streams=*/false);  // exit: never wait for another stream
  // Live buffers at exit (static tensors in tests) are leaked on purpose rather than freed
  // under their owners, and so are blocks another stream may still use (pending_).
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  if (bytes == 0) bytes = 1;
  // Small blocks in 512-byte steps, large ones in 128 KiB steps: coarse enough to reuse blocks
  // across slightly different shapes, fine enough that rounding wastes < 2% of an activation
  // (2 MiB steps wasted ~20% of a ref_cnn step's memory and broke `dptrain plan`'s estimate).
  constexpr size_t kSmall = 512;
  constexpr size_t kLargeStep = 128u << 10;
  if (bytes < (1u << 20)) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
}

namespace {
thread_local std::vector<std::string> t_scopes;
}  // namespace

AllocationScope::AllocationScope(std::string what) { t_scopes.push_back(std::move(what)); }
AllocationScope::~AllocationScope() { t_scopes.pop_back(); }
const std::string& AllocationScope::Current() {
  static const std::string kNone;
  return t_scopes.empty() ? kNone : t_scopes.back();
}

std::shared_ptr<Buffer> CachingAllocator::Allocate(size_t bytes, std::string_view what) {
  const std::string& scope = AllocationScope::Current();
  // "conv1 output" names its layer already; "conv2d staged dy" gets " (layer conv2)".
  const bool named = scope.empty() || (what.size() > scope.size() &&
                                       what.substr(0, scope.size() + 1) == scope + " ");
  const std::string label =
      named ? std::string(what) : std::string(what) + " (layer " + scope + ")";
  const size_t block = RoundSize(bytes);
  std::unique_lock<std::mutex> lock(mu_);
  ReclaimPendingLocked();
  void* ptr = nullptr;
  auto it = free_blocks_.lower_bound(block);
  if (it != free_blocks_.end() && it->first <= 2 * block) {
    ptr = it->second;
    const size_t got = it->first;
    free_blocks_.erase(it);
    live_[ptr] = Live{got, label, {}, {}, {}};
    stats_.in_use += got;
  } else {
    ptr = AllocLocked(block);
    if (ptr == nullptr) {
      EmptyCacheLocked();
      ptr = AllocLocked(block);
    }
    if (ptr == nullptr) {
      ++stats_.num_ooms;
      std::ostringstream os;
      os << "out of memory on " << DeviceName(raw_->device()) << " allocating "
         << FormatBytes(bytes) << " for " << label << "\n"
         << ReportLockedUnsafe(5);
      lock.unlock();
      DPT_THROW(OutOfMemory) << os.str();
    }
    live_[ptr] = Live{block, label, {}, {}, {}};
    stats_.in_use += block;
    stats_.reserved += block;
    ++stats_.num_device_allocs;
  }
  ++stats_.num_allocs;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  const size_t size = live_[ptr].bytes;
  return std::make_shared<Buffer>(this, ptr, size, raw_->device(), std::string(label));
}

void* CachingAllocator::AllocLocked(size_t block) {
  if (budget_ != 0 && stats_.reserved + block > budget_) return nullptr;
  return raw_->Alloc(block);
}

void CachingAllocator::Release(void* ptr, size_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;
  stats_.in_use -= it->second.bytes;
  Live& live = it->second;
  if (live.streams.empty() && live.fences.empty() && live.used_until.empty()) {
    free_blocks_.emplace(live.bytes, ptr);
  } else {
    Pending p{live.bytes, ptr, std::move(live.fences)};
    for (const auto& [stream, fence] : live.used_until) p.fences.push_back(fence);
    for (void* s : live.streams) p.fences.push_back(raw_->RecordFence(s));
    pending_.push_back(std::move(p));
  }
  live_.erase(it);
  (void)bytes;
}

void CachingAllocator::RecordStream(void* ptr, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end() || stream == nullptr) return;
  auto& streams = it->second.streams;
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
}

void CachingAllocator::FenceStreamUse(void* ptr, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end() || stream == nullptr) return;
  Live& live = it->second;
  // A fence that cannot be recorded synchronised the device instead (RawAllocator): nothing
  // left to wait for on that stream.
  void* fence = raw_->RecordFence(stream);
  live.streams.erase(std::remove(live.streams.begin(), live.streams.end(), stream),
                     live.streams.end());
  for (auto& [s, f] : live.used_until) {
    if (s != stream) continue;
    raw_->DestroyFence(f);  // the stream runs in order: the new fence passes after the old one
    f = fence;
    return;
  }
  live.used_until.emplace_back(stream, fence);
}

void CachingAllocator::ForgetStream(void* stream) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [ptr, live] : live_) {
    // A fence already recorded on the stream stays valid after it is destroyed.
    for (size_t i = 0; i < live.used_until.size();) {
      if (live.used_until[i].first == stream) {
        live.fences.push_back(live.used_until[i].second);
        live.used_until.erase(live.used_until.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    auto it = std::find(live.streams.begin(), live.streams.end(), stream);
    if (it == live.streams.end()) continue;
    live.streams.erase(it);
    if (void* fence = raw_->RecordFence(stream)) live.fences.push_back(fence);
  }
}

void CachingAllocator::ReclaimPendingLocked() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    bool done = true;
    for (void* f : p.fences) done = done && raw_->FenceDone(f);
    if (!done) {
      ++i;
      continue;
    }
    for (void* f : p.fences) raw_->DestroyFence(f);
    free_blocks_.emplace(p.bytes, p.ptr);
    if (i + 1 != pending_.size()) pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

bool CachingAllocator::FencesOutstandingLocked() {
  for (const Pending& p : pending_) {
    for (void* f : p.fences) {
      if (!raw_->FenceDone(f)) return true;
    }
  }
  for (const auto& [ptr, live] : live_) {
    for (const auto& [stream, fence] : live.used_until) {
      if (!raw_->FenceDone(fence)) return true;
    }
  }
  return false;
}

void CachingAllocator::EmptyCacheLocked(bool wait_for_streams) {
  // Not while other streams' work is in flight (an NCCL collective: issue 63). The device's free
  // (cudaFree) waits for the whole device, so it would block here, with this lock held, behind
  // the collective; and with a peer dead, until the collective's deadline aborts it. Waiting for
  // the fences first makes that wait explicit and bounded by the same deadlines (the
  // DeadlineMonitor aborts the communicator, its kernels exit, the fences pass). Blocks still
  // fenced stay reserved: freeing them could hand the memory to the device's next allocation
  // while another stream still uses it.
  while (wait_for_streams && FencesOutstandingLocked()) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ReclaimPendingLocked();
  for (auto& [size, ptr] : free_blocks_) {
    raw_->Free(ptr);
    stats_.reserved -= size;
  }
  free_blocks_.clear();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use = stats_.in_use;
  stats_.peak_reserved = stats_.reserved;
}

void CachingAllocator::set_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  budget_ = bytes;
}

std::string CachingAllocator::Report(size_t top) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ReportLockedUnsafe(top);
}

std::string CachingAllocator::ReportLockedUnsafe(size_t top) const {
  std::ostringstream os;
  os << "  in use " << FormatBytes(stats_.in_use) << ", reserved " << FormatBytes(stats_.reserved)
     << ", peak " << FormatBytes(stats_.peak_in_use) << ", ";
  if (budget_ != 0) {
    os << "budget (memory.limit) " << FormatBytes(budget_);
  } else if (raw_->Capacity() != 0) {
    os << "device total " << FormatBytes(raw_->Capacity());
  } else {
    os << "no budget";
  }
  std::vector<std::pair<size_t, std::string>> live;
  live.reserve(live_.size());
  for (const auto& [ptr, l] : live_) live.emplace_back(l.bytes, l.label);
  std::sort(live.begin(), live.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  if (!live.empty()) os << "\n  largest live tensors:";
  for (size_t i = 0; i < std::min(top, live.size()); ++i) {
    os << "\n    " << FormatBytes(live[i].first) << "  " << live[i].second;
  }
  return os.str();
}

std::optional<size_t> TryParseByteSize(std::string_view text, std::string* why) {
  std::string s(text);
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }),
          s.end());
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (const std::exception&) {
    *why = "is not a positive size";
    return std::nullopt;
  }
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "gb")
    mult = 1e9;
  else if (unit == "tb")
    mult = 1e12;
  if (mult == 0 || !(value > 0) || !std::isfinite(value)) {
    *why = "is not a positive size";
    return std::nullopt;
  }
  const double bytes = value * mult;
  if (bytes < 1) {  // it would become 0, which means "no limit"
    *why = "is less than one byte";
    return std::nullopt;
  }
  // 2^63 bytes is far beyond any device; converting a larger double to size_t is undefined.
  if (!(bytes < 9.2e18)) {
    *why = "is too large";
    return std::nullopt;
  }
  return static_cast<size_t>(bytes);
}

size_t ParseByteSize(std::string_view text, std::string_view what) {
  std::string why;
  const std::optional<size_t> bytes = TryParseByteSize(text, &why);
  if (!bytes) {
    DPT_THROW(ConfigError) << what << ": '" << text << "' " << why
                           << " (examples: 512MiB, 2GiB, 1048576)";
  }
  return *bytes;
}

std::string FormatBytes(size_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1ull << 30));
  else if (bytes >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1ull << 20));
  else if (bytes >= (1ull << 10))
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1ull << 10));
  else
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

}  // namespace dptrain
