// SPDX-License-Identifier: Apache-2.0
// Bucketed, overlapped gradient allreduce.
#include "runtime/comm/reducer.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace dptrain {

Reducer::Reducer(Communicator& comm, const Tensor& grads, size_t bucket_bytes,
                 size_t first_bucket_bytes)
    : comm_(comm), grads_(grads) {
  const int64_t total = grads.numel();
  const int64_t first = std::max<int64_t>(1, static_cast<int64_t>(first_bucket_bytes / 4));
  const int64_t rest = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / 4));
  int64_t begin = 0;
  while (begin < total) {
    const int64_t end = std::min(total, begin + (bounds_.empty() ? first : rest));
    bounds_.emplace_back(begin, end);
    views_.push_back(grads_.View(Shape{end - begin}, static_cast<size_t>(begin) * 4));
    begin = end;
  }
}

void Reducer::Begin() {
  DPT_CHECK(inflight_.empty()) << "Reducer::Begin with buckets in flight";
  next_ = 0;
}

void Reducer::OnReady(int64_t ready_floats) {
  while (next_ < bounds_.size() && bounds_[next_].second <= ready_floats) {
    inflight_.push_back(comm_.AllReduceAsync(&views_[next_], ReduceOp::kSum));
    ++next_;
  }
  for (auto& h : inflight_) h->Test();
}

void Reducer::Finish() {
  OnReady(grads_.numel());
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& h : inflight_) h->Wait();
  inflight_.clear();
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dptrain
