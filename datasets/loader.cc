// SPDX-License-Identifier: Apache-2.0
// Loader threads with a bounded reorder queue, the per-sample transforms and the eval reader.
#include "datasets/loader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>

#include "core/error.h"
#include "datasets/augment.h"

namespace dptrain {
namespace {

constexpr int kPad = 4;  // crop-flip: zero pixels added on each side before the random crop
constexpr uint64_t kAugmentSalt = 0x6a09e667f3bcc909ULL;
constexpr uint64_t kFlipSalt = 0xbb67ae8584caa73bULL;  // random-resized-crop's flip bit

// Per-sample random bits for augmentation: a counter-based hash of (seed, epoch, global index)
// only, so every rank, world size and thread count draws the same crop and flip for a sample.
uint64_t AugmentHash(uint64_t seed, int64_t epoch, int64_t index) {
  return Mix64(Mix64(Mix64(seed ^ kAugmentSalt) ^ static_cast<uint64_t>(epoch)) ^
               static_cast<uint64_t>(index));
}

}  // namespace

void ValidateLoaderOptions(const LoaderOptions& opts, const Shape& sample_shape) {
  DPT_CHECK_AS(ConfigError, opts.workers >= 0)
      << "data.workers = " << opts.workers << " must be >= 0";
  DPT_CHECK_AS(ConfigError, opts.prefetch >= 1)
      << "loader prefetch = " << opts.prefetch << " must be >= 1";
  DPT_CHECK_AS(ConfigError, sample_shape.rank() >= 1) << "sample shape is empty";
  const int64_t c = sample_shape[0];
  for (const auto* v : {&opts.mean, &opts.std}) {
    const char* name = v == &opts.mean ? "data.mean" : "data.std";
    if (!v->empty() && v->size() != 1 && static_cast<int64_t>(v->size()) != c) {
      DPT_THROW(ConfigError) << name << " has " << v->size()
                             << " values; give 1 or one per channel (" << c << ")";
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const float x = (*v)[i];
      if (!std::isfinite(x) || (v == &opts.std && x <= 0)) {
        DPT_THROW(ConfigError) << name << "[" << i << "] = " << x
                               << (v == &opts.std ? " must be finite and > 0" : " must be finite");
      }
    }
  }
  if (opts.augment == Augment::kCropFlip) {
    DPT_CHECK_AS(ConfigError, sample_shape.rank() == 3)
        << "data.augment = \"crop-flip\" needs (C, H, W) images, the samples have shape "
        << sample_shape.ToString();
  }
  DPT_CHECK_AS(ConfigError, opts.crop >= 0) << "data.crop = " << opts.crop << " must be >= 0";
  if (opts.augment == Augment::kRandomResizedCrop || opts.crop > 0) {
    const char* what = opts.augment == Augment::kRandomResizedCrop
                           ? "data.augment = \"random-resized-crop\""
                           : "data.crop";
    DPT_CHECK_AS(ConfigError, sample_shape.rank() == 3)
        << what << " needs (C, H, W) images, the samples have shape " << sample_shape.ToString();
  }
  if (opts.crop > 0) {
    DPT_CHECK_AS(ConfigError, opts.augment != Augment::kCropFlip)
        << "data.crop = " << opts.crop << " does not go with data.augment = \"crop-flip\" (which "
        << "keeps the stored size); use \"random-resized-crop\", or data.crop = 0";
    // Evaluation centre-crops, so the crop must fit the stored images.
    DPT_CHECK_AS(ConfigError, opts.crop <= sample_shape[1] && opts.crop <= sample_shape[2])
        << "data.crop = " << opts.crop << " is larger than the stored images (" << sample_shape[1]
        << " x " << sample_shape[2] << "); convert with --size >= " << opts.crop
        << " or lower data.crop";
  }
}

Shape LoaderOutputShape(const LoaderOptions& opts, const Shape& stored) {
  if (opts.crop <= 0 || stored.rank() != 3) return stored;
  return Shape{stored[0], opts.crop, opts.crop};
}

namespace {

bool ChangesGeometry(const LoaderOptions& opts, const Shape& stored) {
  return opts.augment == Augment::kRandomResizedCrop || LoaderOutputShape(opts, stored) != stored;
}

// The crop (or random-resized-crop) of n stored samples `in` into `out`
// (n x LoaderOutputShape), then normalisation.
template <class T>
void CropBatch(const LoaderOptions& opts, const Shape& stored, int64_t epoch,
               const int64_t* indices, int64_t n, const T* in, float* out) {
  const Shape out_shape = LoaderOutputShape(opts, stored);
  const bool rrc = opts.augment == Augment::kRandomResizedCrop;
  const int64_t c = stored[0], h = stored[1], w = stored[2];
  const int64_t oh = out_shape[1], ow = out_shape[2];
  const int64_t in_numel = stored.numel(), out_numel = out_shape.numel();
  for (int64_t i = 0; i < n; ++i) {
    CropBox box;
    bool flip = false;
    if (rrc) {
      // The draws of sample i: a counter-based stream from (seed, epoch, global index), so
      // every rank, world size and thread count crops a sample the same way.
      const uint64_t base = AugmentHash(opts.seed, epoch, indices[i]);
      uint64_t k = 0;
      const std::function<double()> uniform = [&] {
        return static_cast<double>(Mix64(base + ++k) >> 11) * 0x1p-53;
      };
      box = RandomResizedCropBox(h, w, uniform);
      flip = (Mix64(base ^ kFlipSalt) & 1) != 0;
    } else {
      box = CenterCropBox(h, w, oh);
    }
    CropResize(in + i * in_numel, c, h, w, box, oh, ow, flip, out + i * out_numel);
  }
  LoaderOptions rest = opts;
  rest.augment = Augment::kNone;
  ApplyTransforms(rest, out_shape, epoch, indices, n, out);
}

}  // namespace

void TransformBatch(const LoaderOptions& opts, const Shape& stored, int64_t epoch,
                    const int64_t* indices, int64_t n, std::vector<float>* images) {
  if (!ChangesGeometry(opts, stored)) {
    ApplyTransforms(opts, stored, epoch, indices, n, images->data());
    return;
  }
  std::vector<float> out(static_cast<size_t>(n * LoaderOutputShape(opts, stored).numel()));
  CropBatch(opts, stored, epoch, indices, n, images->data(), out.data());
  images->swap(out);
}

namespace {

// Reads b->indices from `ds` into b (reusing b->images' buffer) and transforms them.
void ReadAndTransform(Dataset& ds, const LoaderOptions& opts, int64_t epoch, HostBatch* b) {
  const Shape& stored = ds.info().sample_shape;
  const size_t out_size = static_cast<size_t>(b->n * LoaderOutputShape(opts, stored).numel());
  // resize keeps a recycled buffer's pages (no zeroing when the size is the same).
  b->images.resize(out_size);
  b->labels.resize(static_cast<size_t>(b->n));
  if (ChangesGeometry(opts, stored)) {
    // Crops read the stored pixels: uint8 where the dataset keeps them (a quarter of the bytes
    // of floats), into this thread's buffer, reused batch after batch.
    thread_local std::vector<uint8_t> raw;
    raw.resize(static_cast<size_t>(b->n * stored.numel()));
    if (ds.ReadU8(b->indices.data(), b->n, raw.data(), b->labels.data())) {
      CropBatch(opts, stored, epoch, b->indices.data(), b->n, raw.data(), b->images.data());
      return;
    }
    thread_local std::vector<float> full;
    full.resize(static_cast<size_t>(b->n * stored.numel()));
    ds.Read(b->indices.data(), b->n, full.data(), b->labels.data());
    CropBatch(opts, stored, epoch, b->indices.data(), b->n, full.data(), b->images.data());
    return;
  }
  ds.Read(b->indices.data(), b->n, b->images.data(), b->labels.data());
  ApplyTransforms(opts, stored, epoch, b->indices.data(), b->n, b->images.data());
}

}  // namespace

void ApplyTransforms(const LoaderOptions& opts, const Shape& sample_shape, int64_t epoch,
                     const int64_t* indices, int64_t n, float* images) {
  const int64_t numel = sample_shape.numel();
  const int64_t c = sample_shape[0];
  const int64_t plane = numel / c;
  if (!opts.mean.empty() || !opts.std.empty()) {
    for (int64_t i = 0; i < n; ++i) {
      float* s = images + i * numel;
      for (int64_t ch = 0; ch < c; ++ch) {
        const auto k = static_cast<size_t>(ch);
        const float m = opts.mean.empty() ? 0.0f : opts.mean[opts.mean.size() == 1 ? 0 : k];
        const float sd = opts.std.empty() ? 1.0f : opts.std[opts.std.size() == 1 ? 0 : k];
        const float inv = 1.0f / sd;
        float* p = s + ch * plane;
        for (int64_t j = 0; j < plane; ++j) p[j] = (p[j] - m) * inv;
      }
    }
  }
  if (opts.augment != Augment::kCropFlip) return;
  const int64_t h = sample_shape[1], w = sample_shape[2];
  std::vector<float> src(static_cast<size_t>(numel));
  for (int64_t i = 0; i < n; ++i) {
    float* s = images + i * numel;
    const uint64_t r = AugmentHash(opts.seed, epoch, indices[i]);
    // Crop origin in the padded (H + 8) x (W + 8) image, in [0, 2 * kPad].
    const int64_t oy = static_cast<int64_t>(r % (2 * kPad + 1));
    const int64_t ox = static_cast<int64_t>((r >> 8) % (2 * kPad + 1));
    const bool flip = ((r >> 16) & 1) != 0;
    std::copy_n(s, numel, src.data());
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* in = src.data() + ch * plane;
      float* out = s + ch * plane;
      for (int64_t y = 0; y < h; ++y) {
        const int64_t sy = y + oy - kPad;
        for (int64_t x = 0; x < w; ++x) {
          // Crop, then flip the crop: out(y, x) = crop(y, W-1-x).
          const int64_t sx = (flip ? w - 1 - x : x) + ox - kPad;
          out[y * w + x] =
              (sy >= 0 && sy < h && sx >= 0 && sx < w) ? in[sy * w + sx] : 0.0f;  // zero pad
        }
      }
    }
  }
}

TrainLoader::TrainLoader(Dataset& ds, const Sampler& sampler, LoaderOptions opts)
    : ds_(ds), sampler_(sampler), opts_(std::move(opts)), steps_(sampler.steps_per_epoch()) {
  ValidateLoaderOptions(opts_, ds_.info().sample_shape);
  DPT_CHECK_AS(DataError, sampler_.dataset_size() <= ds_.info().size)
      << ds_.info().path << ": the sampler covers " << sampler_.dataset_size()
      << " samples but the dataset has " << ds_.info().size;
}

TrainLoader::~TrainLoader() { Stop(); }

void TrainLoader::Stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  ready_.clear();
  started_ = false;
}

void TrainLoader::Start(int64_t epoch, int64_t first_step) {
  Stop();
  DPT_CHECK(epoch >= 0 && first_step >= 0 && first_step <= steps_)
      << "loader start at epoch " << epoch << " step " << first_step << " (steps per epoch "
      << steps_ << ")";
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    started_ = true;
    epoch_ = epoch;
    first_step_ = first_step;
    next_step_ = first_step;
    failed_ = nullptr;
  }
  const int n = static_cast<int>(std::min<int64_t>(opts_.workers, steps_ - first_step));
  try {
    for (int w = 0; w < n; ++w) threads_.emplace_back(&TrainLoader::WorkerLoop, this, w);
  } catch (...) {
    Stop();
    throw;
  }
}

HostBatch TrainLoader::Produce(int64_t step) const {
  HostBatch b;
  b.epoch = epoch_;
  b.step = step;
  b.indices = sampler_.RankIndices(epoch_, step);
  b.n = static_cast<int64_t>(b.indices.size());
  {
    std::lock_guard<std::mutex> lock(spare_mu_);
    if (!spare_.empty()) {
      b.images = std::move(spare_.back());
      spare_.pop_back();
    } else {
      ++buffers_made_;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  ReadAndTransform(ds_, opts_, epoch_, &b);
  busy_ns_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  produced_ += b.n;
  return b;
}

double TrainLoader::SamplesPerThreadSecond() const {
  const int64_t ns = busy_ns_.load();
  return ns > 0 ? static_cast<double>(produced_.load()) * 1e9 / static_cast<double>(ns) : 0;
}

void TrainLoader::WorkerLoop(int worker) {
  // epoch_, first_step_ and steps_ were written before this thread started and stay fixed
  // until it is joined.
  for (int64_t step = first_step_ + worker; step < steps_; step += opts_.workers) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || step < next_step_ + opts_.prefetch; });
      if (stop_) return;
    }
    Slot slot;
    try {
      slot.batch = Produce(step);
    } catch (...) {
      slot.error = std::current_exception();
    }
    const bool failed = slot.error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      ready_.emplace(step, std::move(slot));
    }
    cv_.notify_all();
    if (failed) return;  // Next() rethrows when it reaches this step
  }
}

void TrainLoader::Recycle(HostBatch&& b) {
  // Keep as many as can be in use at once (the batches produced ahead, the one being trained
  // on): at an epoch's start every worker produces ahead again, and a pool of fewer buffers
  // than that maps fresh ones (page faults on every pixel) each epoch.
  std::lock_guard<std::mutex> lock(spare_mu_);
  if (spare_.size() <= static_cast<size_t>(std::max(opts_.prefetch, 1))) {  // prefetch + 1
    spare_.push_back(std::move(b.images));
  }
}

HostBatch TrainLoader::Next() {
  if (failed_) std::rethrow_exception(failed_);
  DPT_CHECK(HasNext()) << "TrainLoader::Next() with no batch left (started=" << started_
                       << ", next step " << next_step_ << " of " << steps_ << ")";
  if (opts_.workers == 0) {
    try {
      HostBatch b = Produce(next_step_);
      ++next_step_;
      return b;
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
  }
  Slot slot;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_.count(next_step_) != 0; });
    auto it = ready_.find(next_step_);
    slot = std::move(it->second);
    ready_.erase(it);
    ++next_step_;
  }
  cv_.notify_all();  // a worker may be waiting for the window to move
  if (slot.error) {
    failed_ = slot.error;
    std::rethrow_exception(slot.error);
  }
  return std::move(slot.batch);
}

HostBatch ReadRange(Dataset& ds, int64_t begin, int64_t count, const LoaderOptions& opts) {
  const DatasetInfo& info = ds.info();
  DPT_CHECK(begin >= 0 && count >= 0 && begin + count <= info.size)
      << info.path << ": range [" << begin << ", " << begin + count << ") outside [0, " << info.size
      << ")";
  LoaderOptions o = opts;
  o.augment = Augment::kNone;
  ValidateLoaderOptions(o, info.sample_shape);
  HostBatch b;
  b.n = count;
  b.indices.resize(static_cast<size_t>(count));
  std::iota(b.indices.begin(), b.indices.end(), begin);
  if (count > 0) ReadAndTransform(ds, o, 0, &b);
  return b;
}

EvalLoader::EvalLoader(Dataset& ds, int64_t begin, int64_t end, int64_t batch, LoaderOptions opts)
    : ds_(ds), begin_(begin), end_(end), batch_(batch), pos_(begin), opts_(std::move(opts)) {
  DPT_CHECK(begin >= 0 && begin <= end && end <= ds.info().size)
      << "eval range [" << begin << ", " << end << ") of " << ds.info().size;
  DPT_CHECK_AS(ConfigError, batch > 0) << "eval batch " << batch << " must be positive";
  opts_.augment = Augment::kNone;
  ValidateLoaderOptions(opts_, ds.info().sample_shape);
}

bool EvalLoader::Next(HostBatch* out) {
  if (pos_ >= end_) return false;
  const int64_t count = std::min(batch_, end_ - pos_);
  *out = ReadRange(ds_, pos_, count, opts_);
  out->step = (pos_ - begin_) / batch_;
  pos_ += count;
  return true;
}

}  // namespace dptrain
