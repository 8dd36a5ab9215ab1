// SPDX-License-Identifier: Apache-2.0
// Global-batch sampling (DESIGN.md section 4): which global sample indices each rank reads at each
// (epoch, step), and the exact-once evaluation split. Pure arithmetic: no MPI, no I/O, so any world
// size can be tested in one process.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/util/rng.h"

namespace dptrain {

// Permutations and per-sample augmentation use Mix64 / SplitMix64 (core/util/rng.h), never
// std:: distributions (their output differs between standard libraries).

// Epoch e uses permutation perm_e of [0, N) drawn from (seed, e); step s consumes
// perm_e[s*G, (s+1)*G) (G = global batch) and rank r takes [s*G + r*b, s*G + (r+1)*b),
// b = G / world_size. Every rank runs steps_per_epoch() steps; the incomplete last global batch
// is dropped. A run on 1 rank with batch G sees the same samples per step as W ranks with G/W.
//
// Thread-safe: const methods may be called from several threads (the permutation of the most
// recent epoch is cached behind a mutex). Copies share the cache (it depends only on the
// constructor arguments).
class Sampler {
 public:
  // Throws ConfigError when global_batch <= 0 or global_batch % world_size != 0 (the message
  // suggests the nearest multiples), DataError when global_batch > dataset_size, InternalError
  // for world_size < 1 or rank outside [0, world_size).
  Sampler(int64_t dataset_size, int64_t global_batch, int world_size, int rank, uint64_t seed,
          bool shuffle);

  int64_t dataset_size() const { return n_; }
  int64_t global_batch() const { return g_; }
  int world_size() const { return world_; }
  int rank() const { return rank_; }
  uint64_t seed() const { return seed_; }
  bool shuffle() const { return shuffle_; }

  int64_t steps_per_epoch() const { return n_ / g_; }  // floor(N / G)
  int64_t local_batch() const { return g_ / world_; }  // b = G / world_size

  // Global indices (into the dataset) this rank reads at (epoch, step): local_batch() values.
  // epoch >= 0, step in [0, steps_per_epoch()) (else InternalError).
  std::vector<int64_t> RankIndices(int64_t epoch, int64_t step) const;
  // All G indices of the global batch at (epoch, step), rank 0's slice first.
  std::vector<int64_t> GlobalIndices(int64_t epoch, int64_t step) const;

 private:
  std::vector<int64_t> Slice(int64_t epoch, int64_t begin, int64_t count) const;
  std::shared_ptr<const std::vector<int64_t>> Permutation(int64_t epoch) const;

  int64_t n_;
  int64_t g_;
  int world_;
  int rank_;
  uint64_t seed_;
  bool shuffle_;
  struct Cache;
  std::shared_ptr<Cache> cache_;
};

// Permutation of [0, n) drawn from (seed, epoch) by Fisher-Yates driven by SplitMix64 with
// unbiased bounded draws (rejection). Identical on every platform and standard library.
std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch);

// Exact-once evaluation split, contiguous, no padding: rank r gets [begin, end); the slices of
// ranks 0..world-1 tile [0, n) in order, their sizes differ by at most 1 and a rank may get 0.
std::pair<int64_t, int64_t> EvalShard(int64_t n, int world_size, int rank);

}  // namespace dptrain
