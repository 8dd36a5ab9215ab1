// SPDX-License-Identifier: Apache-2.0
// Sampler: global-batch semantics for world sizes 1..8 in one process, the portable permutation
// and the exact-once evaluation split (DESIGN.md section 4).
#include "datasets/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <thread>

#include "core/error.h"

namespace dptrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kN = 1000;

TEST(SamplerTest, EveryRankRunsSameSteps) {
  for (int world = 1; world <= 8; ++world) {
    const int64_t g = int64_t{24} * world;  // not a divisor of kN: the last global batch is dropped
    for (int r = 0; r < world; ++r) {
      Sampler s(kN, g, world, r, 7, true);
      EXPECT_EQ(s.steps_per_epoch(), kN / g) << "world " << world << " rank " << r;
      EXPECT_EQ(s.local_batch(), 24);
    }
  }
}

TEST(SamplerTest, EachSampleAtMostOncePerEpoch) {
  for (int world = 1; world <= 8; ++world) {
    const int64_t g = int64_t{8} * world;
    for (int64_t epoch : {0, 1, 5}) {
      std::set<int64_t> seen;
      int64_t total = 0;
      for (int r = 0; r < world; ++r) {
        Sampler s(kN, g, world, r, 123, true);
        for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
          for (int64_t i : s.RankIndices(epoch, step)) {
            ASSERT_GE(i, 0);
            ASSERT_LT(i, kN);
            ASSERT_TRUE(seen.insert(i).second)
                << "sample " << i << " twice in epoch " << epoch << ", world " << world;
            ++total;
          }
        }
      }
      EXPECT_EQ(total, (kN / g) * g);
    }
  }
}

TEST(SamplerTest, UnionOfRankSlicesIsGlobalBatch) {
  for (int world = 1; world <= 8; ++world) {
    const int64_t g = int64_t{6} * world;
    std::vector<Sampler> ranks;
    ranks.reserve(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) ranks.emplace_back(kN, g, world, r, 99, true);
    for (int64_t step : {int64_t{0}, int64_t{3}, ranks[0].steps_per_epoch() - 1}) {
      std::vector<int64_t> concat;
      for (const Sampler& s : ranks) {
        const auto idx = s.RankIndices(2, step);
        concat.insert(concat.end(), idx.begin(), idx.end());
      }
      EXPECT_EQ(concat, ranks[0].GlobalIndices(2, step)) << "world " << world << " step " << step;
    }
  }
}

TEST(SamplerTest, FixedSeedGivesSameOrder) {
  Sampler a(kN, 10, 1, 0, 42, true);
  Sampler b(kN, 10, 1, 0, 42, true);
  for (int64_t step = 0; step < a.steps_per_epoch(); ++step) {
    ASSERT_EQ(a.GlobalIndices(3, step), b.GlobalIndices(3, step));
  }
  EXPECT_EQ(EpochPermutation(kN, 42, 3), EpochPermutation(kN, 42, 3));
}

TEST(SamplerTest, DifferentEpochsAndSeedsGiveDifferentOrders) {
  const auto p0 = EpochPermutation(kN, 42, 0);
  const auto p1 = EpochPermutation(kN, 42, 1);
  const auto q0 = EpochPermutation(kN, 43, 0);
  EXPECT_NE(p0, p1);
  EXPECT_NE(p0, q0);
  // seed ^ epoch must not collide: (seed 1, epoch 0) differs from (seed 0, epoch 1).
  EXPECT_NE(EpochPermutation(kN, 1, 0), EpochPermutation(kN, 0, 1));
  Sampler s(kN, 10, 1, 0, 42, true);
  EXPECT_NE(s.GlobalIndices(0, 0), s.GlobalIndices(1, 0));
}

TEST(SamplerTest, PermutationIsAPermutation) {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    auto p = EpochPermutation(n, 5, 2);
    ASSERT_EQ(static_cast<int64_t>(p.size()), n);
    std::sort(p.begin(), p.end());
    std::vector<int64_t> id(static_cast<size_t>(n));
    std::iota(id.begin(), id.end(), 0);
    EXPECT_EQ(p, id);
  }
}

// The permutation is part of the checkpoint contract (resume continues the same order), so it
// must not change between builds, compilers or standard libraries.
TEST(SamplerTest, PermutationIsPinned) {
  EXPECT_THAT(EpochPermutation(10, 42, 0), ElementsAre(3, 1, 6, 8, 4, 5, 9, 7, 2, 0));
  EXPECT_THAT(EpochPermutation(10, 42, 1), ElementsAre(1, 4, 7, 2, 5, 9, 6, 8, 0, 3));
}

TEST(SamplerTest, PermutationIsRoughlyUniform) {
  // Position of element 0 over many epochs: each of 4 positions about 1/4 of the time.
  std::vector<int> count(4, 0);
  for (int64_t e = 0; e < 4000; ++e) {
    const auto p = EpochPermutation(4, 11, e);
    ++count[static_cast<size_t>(std::find(p.begin(), p.end(), 0) - p.begin())];
  }
  for (int c : count) EXPECT_NEAR(c, 1000, 120);
}

TEST(SamplerTest, OneRankSeesSameSamplesAsFourRanks) {
  const int64_t g = 32;
  Sampler one(kN, g, 1, 0, 2024, true);
  std::vector<Sampler> four;
  four.reserve(4);
  for (int r = 0; r < 4; ++r) four.emplace_back(kN, g, 4, r, 2024, true);
  ASSERT_EQ(one.steps_per_epoch(), four[0].steps_per_epoch());
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    for (int64_t step = 0; step < one.steps_per_epoch(); ++step) {
      const auto all = one.RankIndices(epoch, step);
      for (int r = 0; r < 4; ++r) {
        const auto part = four[static_cast<size_t>(r)].RankIndices(epoch, step);
        ASSERT_EQ(part.size(), 8u);
        EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + int64_t{r} * 8))
            << "epoch " << epoch << " step " << step << " rank " << r;
      }
    }
  }
}

TEST(SamplerTest, NoShuffleIsIdentity) {
  Sampler s(100, 10, 2, 1, 42, false);
  EXPECT_THAT(s.RankIndices(0, 0), ElementsAre(5, 6, 7, 8, 9));
  EXPECT_THAT(s.RankIndices(7, 3), ElementsAre(35, 36, 37, 38, 39));
}

TEST(SamplerTest, IndivisibleGlobalBatchIsConfigError) {
  try {
    Sampler s(1000, 100, 3, 0, 1, true);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.global_batch = 100 is not divisible by the 3 ranks; use "
                                    "a multiple of 3, e.g. 99 or 102"));
    EXPECT_EQ(e.exit_code(), kExitUsage);
  }
  try {
    Sampler s(1000, 2, 4, 0, 1, true);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("use a multiple of 4, e.g. 4"));
  }
  EXPECT_THROW(Sampler(1000, 0, 1, 0, 1, true), ConfigError);
}

TEST(SamplerTest, GlobalBatchLargerThanDatasetIsDataError) {
  try {
    Sampler s(10, 16, 2, 0, 1, true);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("10 samples"));
    EXPECT_THAT(e.what(), HasSubstr("16"));
    EXPECT_EQ(e.exit_code(), kExitData);
  }
  Sampler exact(16, 16, 2, 1, 1, true);
  EXPECT_EQ(exact.steps_per_epoch(), 1);
}

TEST(SamplerTest, OutOfRangeStepIsInternalError) {
  Sampler s(100, 10, 1, 0, 1, true);
  EXPECT_THROW(s.RankIndices(0, 10), InternalError);
  EXPECT_THROW(s.RankIndices(-1, 0), InternalError);
  EXPECT_THROW(Sampler(100, 10, 2, 2, 1, true), InternalError);
}

TEST(SamplerTest, ConcurrentCallersAgree) {
  Sampler s(5000, 50, 5, 3, 8, true);
  std::vector<std::vector<int64_t>> got(4);
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t e = 0; e < 3; ++e) {
        for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
          const auto v = s.RankIndices(e, step);
          got[static_cast<size_t>(t)].insert(got[static_cast<size_t>(t)].end(), v.begin(), v.end());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 1; t < 4; ++t) EXPECT_EQ(got[static_cast<size_t>(t)], got[0]);
}

TEST(SamplerTest, EvalShardTilesExactly) {
  for (int64_t n : {0, 1, 7, 100}) {
    for (int world = 1; world <= 8; ++world) {
      int64_t expect_begin = 0;
      int64_t min_size = n, max_size = 0;
      for (int r = 0; r < world; ++r) {
        const auto [b, e] = EvalShard(n, world, r);
        EXPECT_EQ(b, expect_begin) << "n " << n << " world " << world << " rank " << r;
        EXPECT_GE(e, b);
        min_size = std::min(min_size, e - b);
        max_size = std::max(max_size, e - b);
        expect_begin = e;
      }
      EXPECT_EQ(expect_begin, n) << "n " << n << " world " << world;
      EXPECT_LE(max_size - min_size, 1) << "n " << n << " world " << world;
    }
  }
  EXPECT_EQ(EvalShard(7, 8, 7), std::make_pair(int64_t{7}, int64_t{7}));  // a rank may get 0
}

}  // namespace
}  // namespace dptrain
