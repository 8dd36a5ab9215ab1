// SPDX-License-Identifier: Apache-2.0
// The data loader alone (issue 14's ImageNet pipeline): samples/s per loader thread for
// random-resized-crop to 224 from 256 x 256 uint8 storage (an HDF5 file held in RAM, as
// data.cache = "auto" holds a shard that fits), normalised and batched; and the centre crop of
// evaluation. Goal: at least 3,000 samples/s per thread, so two threads feed a ResNet-50 on a
// GPU (about 2,500 samples/s on an H100 in bf16).
//   loader_bench [--samples 1024] [--seconds 3] [--threads 1]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "datasets/sampler.h"

namespace dptrain {
namespace {

int Main(int argc, char** argv) {
  int64_t samples = 1024;
  double seconds = 3;
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--samples") == 0) samples = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
  }
  const int64_t c = 3, s = 256, batch = 64;
  const std::string path =
      (std::filesystem::temp_directory_path() / "dptrain-loader-bench.h5").string();
  {
    // Smooth images (gradients and a pattern), not noise: like photos for the caches.
    std::vector<uint8_t> img(static_cast<size_t>(samples * c * s * s));
    for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>((i * 7 + i / 4096) % 256);
    std::vector<int32_t> labels(static_cast<size_t>(samples));
    for (int64_t i = 0; i < samples; ++i)
      labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 1000);
    WriteHdf5Dataset(path, img.data(), Shape{samples, c, s, s}, labels.data(), 1000);
  }
  OpenOptions o;
  o.cache = CacheMode::kRam;
  auto ds = OpenHdf5Dataset(path, o);
  std::filesystem::remove(path);
  std::printf("loader_bench: %lld samples of 3 x 256 x 256 uint8 in RAM, batch %lld, %d thread%s\n",
              static_cast<long long>(samples), static_cast<long long>(batch), threads,
              threads == 1 ? "" : "s");
  for (const Augment aug : {Augment::kRandomResizedCrop, Augment::kNone}) {
    LoaderOptions lo;
    lo.workers = threads;
    lo.prefetch = 2 * threads;
    lo.augment = aug;
    lo.crop = 224;
    lo.mean = {0.485f, 0.456f, 0.406f};
    lo.std = {0.229f, 0.224f, 0.225f};
    lo.seed = 1;
    const Sampler sampler(samples, batch, 1, 0, 1, true);
    TrainLoader loader(*ds, sampler, lo);
    int64_t done = 0, epoch = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      loader.Start(epoch++, 0);
      while (loader.HasNext()) {
        HostBatch b = loader.Next();
        done += b.n;
        loader.Recycle(std::move(b));  // as the trainer does
      }
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double rate = static_cast<double>(done) / elapsed;
    std::printf("  %-30s %8.0f samples/s, %8.0f per loader thread\n",
                aug == Augment::kRandomResizedCrop ? "random-resized-crop 224, flip"
                                                   : "centre crop 224 (evaluation)",
                rate, rate / threads);
  }
  return 0;
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) { return dptrain::Main(argc, argv); }
