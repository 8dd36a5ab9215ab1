// SPDX-License-Identifier: Apache-2.0
// Loader threads: read this rank's slice of each global batch (Sampler), normalise and augment it
// into host batches, in step order, a bounded number ahead of the trainer. Also the evaluation
// reader over a contiguous range (EvalShard) without augmentation.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "datasets/dataset.h"
#include "datasets/sampler.h"

namespace dptrain {

// data.augment: none, CIFAR's crop-flip, or ImageNet's random-resized-crop (below).
enum class Augment : uint8_t { kNone, kCropFlip, kRandomResizedCrop };

struct LoaderOptions {
  int workers = 2;   // producer threads; 0 = read synchronously inside Next()
  int prefetch = 4;  // batches produced ahead of the consumer (>= 1)
  // Per-channel normalisation x' = (x - mean[c]) / std[c] after Dataset::Read (which gives
  // uint8 pixels as x / 255). Empty = mean 0 / std 1; a single value applies to every channel.
  std::vector<float> mean, std;
  // kNone, or kCropFlip: pad 4 zero pixels on each side (after normalisation), take a random
  // H x W crop of the padded image and flip it horizontally with p = 0.5. The random choice
  // depends only on (seed, epoch, global sample index): the same on any world size, rank or
  // thread.
  // kRandomResizedCrop: torchvision's RandomResizedCrop(crop) (scale (0.08, 1), ratio (3/4, 4/3),
  // its fallback; augment.h) with bilinear resizing, then a horizontal flip with p = 0.5.
  Augment augment = Augment::kNone;
  // data.crop: samples come out crop x crop. Training with kRandomResizedCrop resizes a random
  // box to it; otherwise (evaluation, augment none) the centre crop x crop box, as torchvision's
  // CenterCrop. 0: the stored H x W (random-resized-crop then resizes to that).
  int64_t crop = 0;
  uint64_t seed = 0;
};

// The shape of the samples the loader produces from stored samples of shape `stored`:
// (C, crop, crop) when opts.crop > 0, else `stored`.
Shape LoaderOutputShape(const LoaderOptions& opts, const Shape& stored);

struct HostBatch {
  int64_t epoch = 0, step = 0, n = 0;
  std::vector<float> images;     // (n, C, H, W), normalised (and augmented)
  std::vector<int32_t> labels;   // (n)
  std::vector<int64_t> indices;  // (n) global sample indices, for checks and debugging
};

// Checks LoaderOptions against a sample shape (C, H, W): ConfigError for workers < 0,
// prefetch < 1, mean/std sizes other than 0, 1 or C, std <= 0, crop-flip on samples that are not
// (C, H, W).
void ValidateLoaderOptions(const LoaderOptions& opts, const Shape& sample_shape);

// Normalises and augments `n` samples in place: images (n, C, H, W); indices are their global
// indices (for the augmentation hash). The transforms that keep the shape (normalisation,
// crop-flip); TransformBatch does the rest.
void ApplyTransforms(const LoaderOptions& opts, const Shape& sample_shape, int64_t epoch,
                     const int64_t* indices, int64_t n, float* images);

// Everything the loader does to a batch read from the dataset: the crop or random-resized-crop
// (*images becomes n x LoaderOutputShape), then ApplyTransforms. What the train loader applies
// to each batch (and ReadRange, with augment none).
void TransformBatch(const LoaderOptions& opts, const Shape& stored, int64_t epoch,
                    const int64_t* indices, int64_t n, std::vector<float>* images);

// Produces batches first_step .. steps_per_epoch-1 of one epoch for this rank. Batch k (counted
// from first_step) is produced by worker k % workers; at most `prefetch` batches are ahead of
// the consumer. Next() returns them in step order. The Dataset and Sampler must outlive the
// loader. One consumer thread calls Start/Next/Stop.
class TrainLoader {
 public:
  // Throws ConfigError for invalid options (ValidateLoaderOptions).
  TrainLoader(Dataset& ds, const Sampler& sampler, LoaderOptions opts);
  ~TrainLoader();  // Stop()
  TrainLoader(const TrainLoader&) = delete;
  TrainLoader& operator=(const TrainLoader&) = delete;

  // Stops any current epoch, then begins producing batches first_step.. of `epoch`
  // (first_step in [0, steps_per_epoch()]; equal means nothing left: resume at an epoch end).
  void Start(int64_t epoch, int64_t first_step);
  // True while the current epoch has batches not yet returned by Next().
  bool HasNext() const { return started_ && next_step_ < steps_; }
  // Blocks until the next batch in step order is ready and returns it. Rethrows an exception
  // raised while producing that batch (read error, bad data) in this thread; the loader then
  // stays failed until the next Start(). InternalError when called without a batch left.
  HostBatch Next();
  // Hands a batch's buffers back for the next ones (optional): a batch of 224 x 224 ImageNet
  // samples is tens of MB, which glibc maps and unmaps on every allocation (page faults on
  // every pixel). Thread-safe.
  void Recycle(HostBatch&& b);
  // Image buffers allocated so far, recycled ones not counted: once every batch is recycled,
  // this stays at most prefetch + 1 however many epochs run.
  int64_t BuffersMade() const { return buffers_made_.load(); }
  // The loader's own rate: samples read and transformed per second of a thread's work (summed
  // over its threads, all epochs so far); 0 before any batch. What data.workers multiplies.
  double SamplesPerThreadSecond() const;
  // Stops and joins the workers; batches not yet returned are dropped. Never throws; returns
  // within the time a worker needs to finish the batch it is reading.
  void Stop() noexcept;

 private:
  HostBatch Produce(int64_t step) const;
  void WorkerLoop(int worker);

  Dataset& ds_;
  const Sampler& sampler_;
  LoaderOptions opts_;
  int64_t steps_ = 0;

  // State of the current epoch, guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool stop_ = false;
  int64_t epoch_ = 0;
  int64_t first_step_ = 0;
  int64_t next_step_ = 0;  // the next step Next() returns
  struct Slot {
    HostBatch batch;
    std::exception_ptr error;
  };
  std::map<int64_t, Slot> ready_;  // step -> produced batch (the reorder queue)
  std::exception_ptr failed_;      // sticky after Next() rethrew
  mutable std::atomic<int64_t> busy_ns_{0}, produced_{0};  // SamplesPerThreadSecond()
  mutable std::atomic<int64_t> buffers_made_{0};
  mutable std::mutex spare_mu_;
  mutable std::vector<std::vector<float>> spare_;  // Recycle()d image buffers
  std::vector<std::thread> threads_;
};

// Reads samples [begin, begin + count) with normalisation and no augmentation (evaluation).
HostBatch ReadRange(Dataset& ds, int64_t begin, int64_t count, const LoaderOptions& opts);

// Iterates [begin, end) (e.g. EvalShard) in batches of at most `batch` samples, the last one
// smaller, synchronously. Every sample is returned exactly once.
class EvalLoader {
 public:
  EvalLoader(Dataset& ds, int64_t begin, int64_t end, int64_t batch, LoaderOptions opts);
  // Fills *out with the next batch (step = batch number) and returns true, or returns false at
  // the end of the range.
  bool Next(HostBatch* out);
  int64_t num_batches() const { return (end_ - begin_ + batch_ - 1) / batch_; }

 private:
  Dataset& ds_;
  int64_t begin_, end_, batch_, pos_;
  LoaderOptions opts_;
};

}  // namespace dptrain
