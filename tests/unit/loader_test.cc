// SPDX-License-Identifier: Apache-2.0
// TrainLoader / EvalLoader: step order, sampler indices, normalisation, crop-flip determinism
// across world sizes, worker errors, stopping mid-epoch, synchronous mode.
#include "datasets/loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <set>

#include "core/error.h"

namespace dptrain {
namespace {

using ::testing::HasSubstr;

// N samples of shape (c, h, w); pixel j of sample i = i * 1000 + j, label = i % 10.
std::unique_ptr<Dataset> IndexedDataset(int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t numel = c * h * w;
  std::vector<float> img(static_cast<size_t>(n * numel));
  std::vector<int32_t> lab(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < numel; ++j) {
      img[static_cast<size_t>(i * numel + j)] = static_cast<float>(i * 1000 + j);
    }
    lab[static_cast<size_t>(i)] = static_cast<int32_t>(i % 10);
  }
  return MakeMemoryDataset(std::move(img), std::move(lab), Shape({c, h, w}));
}

// Wraps a dataset: optional delay per Read, and a sample index whose read throws.
class TestDataset : public Dataset {
 public:
  TestDataset(std::unique_ptr<Dataset> inner, int64_t bad_index, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), bad_(bad_index), delay_(delay) {}
  const DatasetInfo& info() const override { return inner_->info(); }
  void Read(const int64_t* indices, int64_t count, float* images, int32_t* labels) override {
    ++reads;
    std::this_thread::sleep_for(delay_);
    for (int64_t i = 0; i < count; ++i) {
      if (indices[i] == bad_) DPT_THROW(DataError) << "test: bad sample " << bad_;
    }
    inner_->Read(indices, count, images, labels);
  }
  std::atomic<int> reads{0};

 private:
  std::unique_ptr<Dataset> inner_;
  int64_t bad_;
  std::chrono::milliseconds delay_;
};

LoaderOptions Opts(int workers, int prefetch) {
  LoaderOptions o;
  o.workers = workers;
  o.prefetch = prefetch;
  return o;
}

TEST(LoaderTest, BatchesArriveInStepOrderWithSamplerIndices) {
  auto ds = IndexedDataset(500, 1, 2, 2);
  for (int workers : {0, 1, 3}) {
    for (int prefetch : {1, 2, 5}) {
      Sampler s(500, 24, 3, 1, 17, true);
      TrainLoader loader(*ds, s, Opts(workers, prefetch));
      for (int64_t epoch : {0, 1}) {
        loader.Start(epoch, 0);
        for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
          ASSERT_TRUE(loader.HasNext());
          const HostBatch b = loader.Next();
          ASSERT_EQ(b.epoch, epoch);
          ASSERT_EQ(b.step, step) << "workers " << workers << " prefetch " << prefetch;
          ASSERT_EQ(b.n, 8);
          const auto idx = s.RankIndices(epoch, step);
          ASSERT_EQ(b.indices, idx);
          for (int64_t k = 0; k < b.n; ++k) {
            const auto i = static_cast<size_t>(k);
            ASSERT_EQ(b.labels[i], idx[i] % 10);
            ASSERT_EQ(b.images[i * 4 + 3], static_cast<float>(idx[i] * 1000 + 3));
          }
        }
        EXPECT_FALSE(loader.HasNext());
        EXPECT_THROW(loader.Next(), InternalError);
      }
    }
  }
}

TEST(LoaderTest, RecycledBuffersLastAcrossEpochs) {
  // A consumer slower than the workers, so they fill the prefetch window at every epoch's
  // start: with a pool smaller than the buffers in use, each epoch allocated fresh ones (tens
  // of MB each for ImageNet batches, page-faulted pixel by pixel).
  auto ds = IndexedDataset(64, 1, 2, 2);
  Sampler s(64, 8, 1, 0, 5, true);
  TrainLoader loader(*ds, s, Opts(2, 4));
  int64_t after_first = 0;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    loader.Start(epoch, 0);
    while (loader.HasNext()) {
      HostBatch b = loader.Next();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      loader.Recycle(std::move(b));
    }
    if (epoch == 0) after_first = loader.BuffersMade();
  }
  EXPECT_GE(after_first, 1);
  // At most prefetch + 1 in use at once, so no more made however many epochs ran (the old
  // pool of 2 made about 14 here).
  EXPECT_LE(loader.BuffersMade(), 4 + 1);
}

TEST(LoaderTest, StartMidEpochResumes) {
  auto ds = IndexedDataset(100, 1, 1, 1);
  Sampler s(100, 10, 1, 0, 3, true);
  TrainLoader loader(*ds, s, Opts(2, 2));
  loader.Start(4, 7);
  for (int64_t step = 7; step < 10; ++step) EXPECT_EQ(loader.Next().step, step);
  EXPECT_FALSE(loader.HasNext());
  loader.Start(4, 10);  // at the end of the epoch: nothing left
  EXPECT_FALSE(loader.HasNext());
}

TEST(LoaderTest, NormalisesPerChannelAndBroadcasts) {
  // One sample, 2 channels of 2 pixels: values 0, 1, 2, 3.
  auto ds = MakeMemoryDataset({0, 1, 2, 3, 4, 5, 6, 7}, {0, 1}, Shape({2, 1, 2}));
  LoaderOptions o;
  o.mean = {1.0f, 2.0f};
  o.std = {2.0f, 4.0f};
  HostBatch b = ReadRange(*ds, 0, 1, o);
  EXPECT_THAT(b.images, ::testing::ElementsAre(-0.5f, 0.0f, 0.0f, 0.25f));
  o.mean = {1.0f};
  o.std = {0.5f};
  b = ReadRange(*ds, 1, 1, o);
  EXPECT_THAT(b.images, ::testing::ElementsAre(6.0f, 8.0f, 10.0f, 12.0f));
  o.mean.clear();
  o.std = {2.0f};
  b = ReadRange(*ds, 1, 1, o);
  EXPECT_THAT(b.images, ::testing::ElementsAre(2.0f, 2.5f, 3.0f, 3.5f));
}

TEST(LoaderTest, InvalidOptionsAreConfigErrors) {
  auto ds = IndexedDataset(10, 3, 4, 4);
  Sampler s(10, 2, 1, 0, 0, false);
  auto bad = [&](const LoaderOptions& o) { EXPECT_THROW(TrainLoader(*ds, s, o), ConfigError); };
  LoaderOptions o;
  o.mean = {0.1f, 0.2f};
  bad(o);
  o = LoaderOptions();
  o.std = {1.0f, 0.0f, 1.0f};
  bad(o);
  // An unknown augmentation cannot be expressed: data.augment is parsed into Augment once.
  o = LoaderOptions();
  o.workers = -1;
  bad(o);
  o = LoaderOptions();
  o.prefetch = 0;
  bad(o);
}

// True when `out` (c, h, w) equals `in` padded by 4 zeros, cropped at (oy, ox), maybe flipped.
bool IsCropFlipOf(const float* in, const float* out, int64_t c, int64_t h, int64_t w, int oy,
                  int ox, bool flip) {
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        const int64_t sy = y + oy - 4, sx = (flip ? w - 1 - x : x) + ox - 4;
        const float expect =
            (sy >= 0 && sy < h && sx >= 0 && sx < w) ? in[(ch * h + sy) * w + sx] : 0.0f;
        if (out[(ch * h + y) * w + x] != expect) return false;
      }
    }
  }
  return true;
}

TEST(LoaderTest, CropFlipIsAPaddedCropAndFlip) {
  const int64_t c = 2, h = 6, w = 5, n = 200;
  auto ds = IndexedDataset(n, c, h, w);
  Sampler s(n, 20, 1, 0, 9, true);
  LoaderOptions o = Opts(2, 2);
  o.augment = Augment::kCropFlip;
  o.seed = 77;
  o.mean = {100.0f};  // normalisation first, then zero padding in normalised space
  TrainLoader loader(*ds, s, o);
  loader.Start(0, 0);
  std::set<std::tuple<int, int, bool>> seen;
  int identity = 0;
  for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
    const HostBatch b = loader.Next();
    for (int64_t k = 0; k < b.n; ++k) {
      // The normalised, un-augmented sample.
      HostBatch plain = ReadRange(*ds, b.indices[static_cast<size_t>(k)], 1, o);
      const float* out = b.images.data() + k * c * h * w;
      int matches = 0;
      for (int oy = 0; oy <= 8; ++oy) {
        for (int ox = 0; ox <= 8; ++ox) {
          for (bool flip : {false, true}) {
            if (IsCropFlipOf(plain.images.data(), out, c, h, w, oy, ox, flip)) {
              ++matches;
              seen.insert({oy, ox, flip});
              if (oy == 4 && ox == 4 && !flip) ++identity;
            }
          }
        }
      }
      ASSERT_EQ(matches, 1) << "sample " << b.indices[static_cast<size_t>(k)];
    }
  }
  EXPECT_GT(seen.size(), 60u);  // of 162 choices, from 200 samples
  EXPECT_LT(identity, 20);
}

TEST(LoaderTest, CropFlipIndependentOfWorldSizeRankAndThreads) {
  const int64_t n = 256, g = 32;
  auto ds = IndexedDataset(n, 3, 8, 8);
  LoaderOptions base;
  base.augment = Augment::kCropFlip;
  base.seed = 5;
  base.mean = {0.5f};
  base.std = {2.0f};
  // Reference: 1 rank, synchronous.
  Sampler one(n, g, 1, 0, 11, true);
  LoaderOptions sync = base;
  sync.workers = 0;
  TrainLoader ref(*ds, one, sync);
  for (int64_t epoch : {0, 3}) {
    ref.Start(epoch, 0);
    std::vector<HostBatch> ref_batches;
    while (ref.HasNext()) ref_batches.push_back(ref.Next());
    for (int world : {2, 4}) {
      for (int r = 0; r < world; ++r) {
        Sampler s(n, g, world, r, 11, true);
        LoaderOptions o = base;
        o.workers = 1 + r % 3;
        TrainLoader loader(*ds, s, o);
        loader.Start(epoch, 0);
        const int64_t numel = int64_t{3} * 8 * 8, b = g / world;
        for (const HostBatch& rb : ref_batches) {
          const HostBatch got = loader.Next();
          const auto first = rb.images.begin() + r * b * numel;
          ASSERT_TRUE(std::equal(got.images.begin(), got.images.end(), first))
              << "epoch " << epoch << " world " << world << " rank " << r << " step " << got.step;
        }
      }
    }
  }
}

TEST(LoaderTest, CropFlipDependsOnEpochAndSeed) {
  auto ds = IndexedDataset(64, 1, 8, 8);
  LoaderOptions o;
  o.augment = Augment::kCropFlip;
  o.seed = 1;
  const HostBatch plain = ReadRange(*ds, 0, 64, o);
  auto augmented = [&](uint64_t seed, int64_t epoch) {
    std::vector<float> img = plain.images;
    LoaderOptions x = o;
    x.seed = seed;
    ApplyTransforms(x, ds->info().sample_shape, epoch, plain.indices.data(), 64, img.data());
    return img;
  };
  EXPECT_EQ(augmented(1, 0), augmented(1, 0));
  EXPECT_NE(augmented(1, 0), augmented(1, 1));
  EXPECT_NE(augmented(1, 0), augmented(2, 0));
}

TEST(LoaderTest, WorkerExceptionReachesNext) {
  for (int workers : {0, 1, 3}) {
    Sampler s(100, 10, 1, 0, 0, false);  // identity: sample 53 is in step 5
    TestDataset ds(IndexedDataset(100, 1, 1, 1), 53, std::chrono::milliseconds(0));
    TrainLoader loader(ds, s, Opts(workers, 3));
    loader.Start(0, 0);
    for (int64_t step = 0; step < 5; ++step) EXPECT_EQ(loader.Next().step, step);
    try {
      loader.Next();
      FAIL() << "expected DataError, workers " << workers;
    } catch (const DataError& e) {
      EXPECT_THAT(e.what(), HasSubstr("bad sample 53"));
    }
    EXPECT_THROW(loader.Next(), DataError);  // stays failed
    loader.Start(0, 6);                      // a new start clears it
    EXPECT_EQ(loader.Next().step, 6);
  }
}

TEST(LoaderTest, StopAndDestroyMidEpochDoNotHang) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    Sampler s(1000, 10, 1, 0, 1, true);
    TestDataset ds(IndexedDataset(1000, 1, 1, 1), -1, std::chrono::milliseconds(5));
    TrainLoader loader(ds, s, Opts(4, 2));
    loader.Start(0, 0);
    loader.Next();
    loader.Stop();
    EXPECT_FALSE(loader.HasNext());
    loader.Start(1, 0);
    loader.Next();
    // Workers are blocked on the prefetch window; the destructor must release them.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_LE(ds.reads.load(), 2 + 2 + 4);  // bounded by prefetch, not the whole epoch
  }
  {
    Sampler s(1000, 10, 1, 0, 1, true);
    TestDataset ds(IndexedDataset(1000, 1, 1, 1), -1, std::chrono::milliseconds(5));
    TrainLoader loader(ds, s, Opts(3, 4));
    loader.Start(0, 0);  // destroyed before any Next()
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(LoaderTest, WorkersZeroMatchesThreaded) {
  auto ds = IndexedDataset(300, 1, 3, 3);
  Sampler s(300, 16, 2, 0, 4, true);
  LoaderOptions o;
  o.augment = Augment::kCropFlip;
  TrainLoader sync(*ds, s, Opts(0, 1));
  o.workers = 0;
  TrainLoader sync2(*ds, s, o);
  o.workers = 2;
  TrainLoader threaded(*ds, s, o);
  sync2.Start(2, 0);
  threaded.Start(2, 0);
  sync.Start(2, 0);
  while (threaded.HasNext()) {
    const HostBatch a = sync2.Next();
    const HostBatch b = threaded.Next();
    const HostBatch c = sync.Next();
    ASSERT_EQ(a.images, b.images);
    ASSERT_EQ(a.labels, b.labels);
    ASSERT_EQ(a.indices, c.indices);
  }
  EXPECT_FALSE(sync2.HasNext());
}

TEST(LoaderTest, EvalLoaderCoversShardExactlyOnce) {
  auto ds = IndexedDataset(103, 1, 1, 1);
  std::vector<int64_t> all;
  for (int r = 0; r < 4; ++r) {
    const auto [begin, end] = EvalShard(103, 4, r);
    LoaderOptions o;
    o.augment = Augment::kCropFlip;  // ignored for evaluation
    EvalLoader ev(*ds, begin, end, 10, o);
    EXPECT_EQ(ev.num_batches(), (end - begin + 9) / 10);
    HostBatch b;
    int64_t batches = 0;
    while (ev.Next(&b)) {
      EXPECT_EQ(b.step, batches++);
      EXPECT_LE(b.n, 10);
      for (int64_t k = 0; k < b.n; ++k) {
        EXPECT_EQ(b.images[static_cast<size_t>(k)], b.indices[static_cast<size_t>(k)] * 1000.0f);
      }
      all.insert(all.end(), b.indices.begin(), b.indices.end());
    }
    EXPECT_EQ(batches, ev.num_batches());
  }
  std::vector<int64_t> expect(103);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(all, expect);
}

}  // namespace
}  // namespace dptrain
