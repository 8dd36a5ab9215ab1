// SPDX-License-Identifier: Apache-2.0
// Gradient reducer: splits the flat gradient buffer into buckets (the first one small so
// communication starts early, then `bucket_bytes` each) and allreduces (sums) each bucket
// asynchronously as soon as backward has made it final, always in the same order on every rank.
// The optimizer then scales by 1 / (world size x micro-steps).
#pragma once

#include <memory>
#include <vector>

#include "runtime/comm/communicator.h"

namespace dptrain {

class Reducer {
 public:
  Reducer(Communicator& comm, const Tensor& grads, size_t bucket_bytes,
          size_t first_bucket_bytes = size_t{1} << 20);

  // Call before the backward whose gradients are to be reduced.
  void Begin();
  // grads[0, ready_floats) are final: launches every bucket that lies entirely inside, then
  // polls the ones in flight so MPI progresses them while backward continues.
  void OnReady(int64_t ready_floats);
  // Launches whatever is left and waits for every bucket.
  void Finish();

  size_t num_buckets() const { return bounds_.size(); }
  // Seconds spent blocked in Finish() during the last step (exposed communication).
  double last_wait_seconds() const { return last_wait_s_; }

 private:
  Communicator& comm_;
  Tensor grads_;
  std::vector<std::pair<int64_t, int64_t>> bounds_;  // [begin, end) in floats
  std::vector<Tensor> views_;
  std::vector<std::unique_ptr<CommHandle>> inflight_;
  size_t next_ = 0;
  double last_wait_s_ = 0;
};

}  // namespace dptrain
