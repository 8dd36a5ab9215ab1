// SPDX-License-Identifier: Apache-2.0
// Sampler arithmetic and the portable epoch permutation.
#include "datasets/sampler.h"

#include <algorithm>
#include <mutex>
#include <numeric>

#include "core/error.h"

namespace dptrain {
namespace {

constexpr uint64_t kGolden = SplitMix64::kGolden;

}  // namespace

std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  DPT_CHECK(n >= 0) << "permutation of " << n << " elements";
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  // Nested mixing so that (seed, epoch) pairs never collide the way seed ^ epoch would.
  SplitMix64 rng(Mix64(Mix64(seed) ^ (static_cast<uint64_t>(epoch) * kGolden + 1)));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

std::pair<int64_t, int64_t> EvalShard(int64_t n, int world_size, int rank) {
  DPT_CHECK(n >= 0 && world_size >= 1 && rank >= 0 && rank < world_size)
      << "EvalShard(n=" << n << ", world=" << world_size << ", rank=" << rank << ")";
  const int64_t base = n / world_size;
  const int64_t extra = n % world_size;  // the first `extra` ranks get one more
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  const int64_t end = begin + base + (rank < extra ? 1 : 0);
  return {begin, end};
}

struct Sampler::Cache {
  std::mutex mu;
  int64_t epoch = -1;
  std::shared_ptr<const std::vector<int64_t>> perm;
};

Sampler::Sampler(int64_t dataset_size, int64_t global_batch, int world_size, int rank,
                 uint64_t seed, bool shuffle)
    : n_(dataset_size),
      g_(global_batch),
      world_(world_size),
      rank_(rank),
      seed_(seed),
      shuffle_(shuffle),
      cache_(std::make_shared<Cache>()) {
  DPT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size)
      << "rank " << rank << " of world size " << world_size;
  if (global_batch <= 0) {
    DPT_THROW(ConfigError) << "train.global_batch = " << global_batch << " must be positive";
  }
  if (global_batch % world_size != 0) {
    const int64_t below = global_batch - global_batch % world_size;
    const int64_t above = below + world_size;
    DPT_THROW(ConfigError) << "train.global_batch = " << global_batch << " is not divisible by the "
                           << world_size << " ranks; use a multiple of " << world_size << ", e.g. "
                           << (below > 0 ? std::to_string(below) + " or " : std::string()) << above;
  }
  if (global_batch > dataset_size) {
    DPT_THROW(DataError) << "the dataset has " << dataset_size
                         << " samples, fewer than one global batch (train.global_batch = "
                         << global_batch << ")";
  }
}

std::shared_ptr<const std::vector<int64_t>> Sampler::Permutation(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  if (cache_->epoch != epoch || cache_->perm == nullptr) {
    // Computed under the lock: concurrent callers for the same epoch wait instead of repeating
    // an O(N) shuffle.
    cache_->perm = std::make_shared<const std::vector<int64_t>>(EpochPermutation(n_, seed_, epoch));
    cache_->epoch = epoch;
  }
  return cache_->perm;
}

std::vector<int64_t> Sampler::Slice(int64_t epoch, int64_t begin, int64_t count) const {
  std::vector<int64_t> out(static_cast<size_t>(count));
  if (!shuffle_) {
    std::iota(out.begin(), out.end(), begin);
    return out;
  }
  const auto perm = Permutation(epoch);
  std::copy_n(perm->begin() + begin, count, out.begin());
  return out;
}

std::vector<int64_t> Sampler::RankIndices(int64_t epoch, int64_t step) const {
  DPT_CHECK(epoch >= 0 && step >= 0 && step < steps_per_epoch())
      << "epoch " << epoch << " step " << step << " (steps per epoch " << steps_per_epoch() << ")";
  const int64_t b = local_batch();
  return Slice(epoch, step * g_ + rank_ * b, b);
}

std::vector<int64_t> Sampler::GlobalIndices(int64_t epoch, int64_t step) const {
  DPT_CHECK(epoch >= 0 && step >= 0 && step < steps_per_epoch())
      << "epoch " << epoch << " step " << step << " (steps per epoch " << steps_per_epoch() << ")";
  return Slice(epoch, step * g_, g_);
}

}  // namespace dptrain
