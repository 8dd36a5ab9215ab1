// SPDX-License-Identifier: Apache-2.0
// The machine's multiply-add peak, measured: independent chains of the widest FMA the CPU has
// (AVX-512, else AVX2+FMA) and of AVX512-BF16 dot products, on N threads at once, so the clock
// is what N busy cores really run at. bench/run.sh divides achieved GFLOP/s by it.
//
//   peak_bench [THREADS]   prints `peak fp32 <GFLOP/s> isa <isa> threads <N>` and, with
//                          AVX512-BF16, `peak bf16 <GFLOP/s> isa avx512_bf16 threads <N>`;
//                          on other CPUs `peak fp32 unknown` (run.sh then uses its derived peak)
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
namespace {

constexpr int kChains = 16;  // > FMA latency (4 cycles) x FMA units (2): the units never wait
constexpr long kIters = 100'000'000;  // about 0.2 s per measurement at 4 GHz

// The sum of a vector's lanes (not _mm512_reduce_add_ps: GCC 12's header trips -Wuninitialized).
__attribute__((target("avx512f"))) float Lanes(__m512 v) {
  float out[16];
  _mm512_storeu_ps(out, v);
  float s = 0;
  for (float x : out) s += x;
  return s;
}

// Each function returns a value made from every accumulator so none is optimised away.
__attribute__((target("avx512f"))) float Fma512(long iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1e-3f * static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return Lanes(s);
}

__attribute__((target("avx2,fma"))) float Fma256(long iters) {
  constexpr int kChains256 = 12;  // 16 ymm registers: 12 accumulators and the 2 constants
  __m256 acc[kChains256];
  for (int c = 0; c < kChains256; ++c) acc[c] = _mm256_set1_ps(1e-3f * static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) {
    for (int c = 0; c < kChains256; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 s = acc[0];
  for (int c = 1; c < kChains256; ++c) s = _mm256_add_ps(s, acc[c]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

// vdpbf16ps: 16 fp32 lanes, each adds two bf16 products (4 FLOP per lane per instruction).
__attribute__((target("avx512f,avx512bf16"))) float Bf16Dot512(long iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1e-3f * static_cast<float>(c));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f));
  for (long i = 0; i < iters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, a);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return Lanes(s);
}

// Runs `kernel` on `threads` threads at once; returns GFLOP/s over all of them.
double MeasureOnce(float (*kernel)(long), int threads, double flop_per_iter) {
  std::vector<float> sink(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&sink, kernel, t] { sink[static_cast<size_t>(t)] = kernel(kIters); });
  }
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float all = 0;
  for (float v : sink) all += v;
  if (all == 12345.f) std::puts("");  // keep the results observable
  return flop_per_iter * static_cast<double>(kIters) * threads / s / 1e9;
}

// The best of 3 (a shared or virtual machine steals cycles now and then), after a warm-up that
// wakes the vector units and lets the clock settle.
double Measure(float (*kernel)(long), int threads, double flop_per_iter) {
  kernel(kIters / 20);
  double best = 0;
  for (int i = 0; i < 3; ++i) best = std::max(best, MeasureOnce(kernel, threads, flop_per_iter));
  return best;
}

}  // namespace
#endif

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  if (threads < 1) {
    std::fprintf(stderr, "usage: peak_bench [THREADS >= 1]\n");
    return 2;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    std::printf("peak fp32 %.1f isa avx512 threads %d\n",
                Measure(Fma512, threads, kChains * 16 * 2.0), threads);
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    std::printf("peak fp32 %.1f isa avx2 threads %d\n", Measure(Fma256, threads, 12 * 8 * 2.0),
                threads);
  } else {
    std::printf("peak fp32 unknown isa none threads %d\n", threads);
  }
  if (__builtin_cpu_supports("avx512bf16")) {
    std::printf("peak bf16 %.1f isa avx512_bf16 threads %d\n",
                Measure(Bf16Dot512, threads, kChains * 16 * 4.0), threads);
  }
#else
  std::printf("peak fp32 unknown isa none threads %d\n", threads);
#endif
  return 0;
}
