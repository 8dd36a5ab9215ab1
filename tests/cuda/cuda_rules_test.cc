// SPDX-License-Identifier: Apache-2.0
// The CUDA backend's pure rules (core/cuda/cuda_rules.h), label unit: they need the CUDA backend
// built but no GPU. Which conv2d shapes the legacy descriptors can describe, which of cuDNN's
// heuristic results PickConvAlgo runs (and what it never gives up), and device names for whole
// GPUs and MIG instances.
#include "core/cuda/cuda_rules.h"

#include <gtest/gtest.h>

#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda/cuda_check.h"

namespace dptrain::cuda {
namespace {

Conv2dDesc Conv(int64_t n, int64_t c, int64_t hw, int64_t k, int64_t r) {
  Conv2dDesc d;
  d.n = n;
  d.c = c;
  d.h = d.w = hw;
  d.k = k;
  d.r = d.s = r;
  d.pad = r / 2;
  return d;
}

TEST(CudaRulesTest, ConvOperandsMustHaveFewerThan2To31Elements) {
  EXPECT_TRUE(ConvFitsLegacyDescriptors(Conv(256, 64, 56, 64, 3)));
  // x: 1024 x 64 x 224 x 224 = 3.3e9 elements: each dimension fits an int, the count does not.
  EXPECT_FALSE(ConvFitsLegacyDescriptors(Conv(1024, 64, 224, 3, 3))) << "input";
  // y: 64 x 3 x 512 x 512 in, 64 x 2048 x 512 x 512 out = 3.4e10.
  EXPECT_FALSE(ConvFitsLegacyDescriptors(Conv(64, 3, 512, 2048, 1))) << "output";
  // w: 65536 x 65536 x 1 x 1 = 4.3e9.
  EXPECT_FALSE(ConvFitsLegacyDescriptors(Conv(1, 65536, 1, 65536, 1))) << "filter";
  // Exactly at the limit: 2^31 - 1 is describable, 2^31 is not.
  Conv2dDesc at = Conv(1, 1, 1, 1, 1);
  at.n = INT_MAX;
  EXPECT_TRUE(ConvFitsLegacyDescriptors(at));
  at.n = int64_t{INT_MAX} + 1;
  EXPECT_FALSE(ConvFitsLegacyDescriptors(at));
  Conv2dDesc bad = Conv(8, 3, 32, 16, 3);
  bad.stride = 0;
  EXPECT_FALSE(ConvFitsLegacyDescriptors(bad)) << "an invalid shape is unsupported, not a crash";
}

AlgoCandidate Algo(bool deterministic, int math, size_t workspace, bool ok = true,
                   bool precise = true) {
  return {ok, deterministic, math, workspace, precise};
}

TEST(CudaRulesTest, EveryPrecisionPrefersAPreciseAlgorithmOverAFasterFftOrWinograd) {
  const std::vector<AlgoCandidate> perfs = {
      Algo(true, kCudnnFmaMath, 0, true, /*precise=*/false),  // FFT: fastest
      Algo(true, kCudnnFmaMath, 0),
  };
  std::string relaxed;
  EXPECT_EQ(PickConvAlgo(perfs, true, Determinism::kPreferred, 1 << 30, &relaxed), 1u);
  EXPECT_EQ(relaxed, "");
  EXPECT_EQ(PickConvAlgo(perfs, false, Determinism::kPreferred, 1 << 30), 1u)
      << "bf16/fp16 too: their transforms round in 16 bits";
  // Only an FFT algorithm: taken, and said so.
  EXPECT_EQ(PickConvAlgo({perfs[0]}, true, Determinism::kRequired, 1 << 30, &relaxed), 0u);
  EXPECT_EQ(relaxed, "the workspace cap and a precise algorithm (FFT/Winograd)");
}

TEST(CudaRulesTest, TakesTheFastestResultThatMeetsEveryRequirement) {
  const std::vector<AlgoCandidate> perfs = {
      Algo(true, kCudnnFmaMath, 0, /*ok=*/false),  // not supported for this shape
      Algo(false, kCudnnFmaMath, 0),               // fastest usable, not deterministic
      Algo(true, kCudnnTensorOpMath, 0),           // TF32: never for fp32
      Algo(true, kCudnnFmaMath, 1 << 20),
  };
  std::string relaxed;
  EXPECT_EQ(PickConvAlgo(perfs, true, Determinism::kPreferred, 1 << 30, &relaxed), 3u);
  EXPECT_EQ(relaxed, "");
  EXPECT_EQ(PickConvAlgo(perfs, true, Determinism::kAny, 1 << 30), 1u);
  EXPECT_EQ(PickConvAlgo(perfs, false, Determinism::kPreferred, 1 << 30), 2u)
      << "bf16/fp16 may use tensor-op math";
  EXPECT_EQ(PickConvAlgo(perfs, true, Determinism::kPreferred, 1024, &relaxed), 3u)
      << "the workspace cap is given up first";
  EXPECT_EQ(relaxed, "the workspace cap");
}

// The point of the order: with train.deterministic, determinism is never relaxed, and the math
// type is relaxed before determinism (the old order gave determinism up first, then forced FMA
// on an algorithm cuDNN had reported with another math type).
TEST(CudaRulesTest, DeterminismIsNeverGivenUpWhenRequired) {
  const std::vector<AlgoCandidate> only_fast = {Algo(false, kCudnnFmaMath, 0)};
  EXPECT_EQ(PickConvAlgo(only_fast, true, Determinism::kRequired, 1 << 30), std::nullopt)
      << "no deterministic algorithm: an error naming the layer, never a silent fallback";
  std::string relaxed;
  EXPECT_EQ(PickConvAlgo(only_fast, true, Determinism::kPreferred, 1 << 30, &relaxed), 0u);
  EXPECT_NE(relaxed.find("determinism"), std::string::npos) << relaxed;

  const std::vector<AlgoCandidate> perfs = {
      Algo(false, kCudnnFmaMath, 0),     // FMA but not deterministic
      Algo(true, kCudnnDefaultMath, 0),  // deterministic, reported with default math
  };
  EXPECT_EQ(PickConvAlgo(perfs, true, Determinism::kRequired, 1 << 30, &relaxed), 1u);
  EXPECT_NE(relaxed.find("FMA-only"), std::string::npos) << relaxed;
  EXPECT_EQ(PickConvAlgo(perfs, true, Determinism::kPreferred, 1 << 30), 1u)
      << "math type is relaxed before determinism";
  EXPECT_EQ(perfs[1].math, kCudnnDefaultMath) << "the caller keeps the reported math type";
}

TEST(CudaRulesTest, TensorOpMathIsNeverChosenForFp32) {
  const std::vector<AlgoCandidate> perfs = {Algo(true, kCudnnTensorOpMath, 0),
                                            Algo(true, kCudnnTensorOpMathAllowConversion, 0)};
  EXPECT_EQ(PickConvAlgo(perfs, true, Determinism::kPreferred, 1 << 30), std::nullopt);
  EXPECT_EQ(PickConvAlgo(perfs, false, Determinism::kRequired, 1 << 30), 0u);
  EXPECT_EQ(PickConvAlgo({}, false, Determinism::kAny, 0), std::nullopt);
}

// train.tf32 (the default, as PyTorch's convolutions): an fp32 plan is not strict, so cuDNN's
// fastest tensor-op (TF32) algorithm is taken as in 16 bits; the other rules still hold.
TEST(CudaRulesTest, Tf32TakesTheFastestTensorOpAlgorithmForFp32) {
  const std::vector<AlgoCandidate> perfs = {
      Algo(true, kCudnnTensorOpMath, 0, true, /*precise=*/false),  // TF32 Winograd: not precise
      Algo(false, kCudnnTensorOpMath, 0),                          // TF32, not deterministic
      Algo(true, kCudnnDefaultMath, 0),                            // TF32 under default math
      Algo(true, kCudnnFmaMath, 0),
  };
  const bool strict = false;  // fp32 with train.tf32
  EXPECT_EQ(PickConvAlgo(perfs, strict, Determinism::kPreferred, 1 << 30), 2u);
  EXPECT_EQ(PickConvAlgo(perfs, strict, Determinism::kAny, 1 << 30), 1u);
  EXPECT_EQ(PickConvAlgo(perfs, /*fp32_strict=*/true, Determinism::kAny, 1 << 30), 3u)
      << "train.tf32 = false: FMA only";
}

TEST(CudaRulesTest, MigInstancesAreNamedByTheirOwnUuid) {
  const Uuid gpu = {0x8f, 0x6c, 0x1a, 0x2e, 0x01, 0x23, 0x45, 0x67,
                    0x89, 0xab, 0xcd, 0xef, 0x10, 0x32, 0x54, 0x76};
  Uuid mig = gpu;
  mig[0] = 0x9b;
  EXPECT_EQ(DeviceUuidString(gpu, gpu), "GPU-8f6c1a2e-0123-4567-89ab-cdef10325476");
  EXPECT_EQ(DeviceUuidString(gpu, std::nullopt), "GPU-8f6c1a2e-0123-4567-89ab-cdef10325476")
      << "an old driver without cuDeviceGetUuid: a whole GPU";
  EXPECT_EQ(DeviceUuidString(mig, gpu), "MIG-9b6c1a2e-0123-4567-89ab-cdef10325476");
  Uuid mig2 = gpu;
  mig2[15] = 0x00;
  EXPECT_NE(DeviceUuidString(mig, gpu), DeviceUuidString(mig2, gpu))
      << "two slices of one GPU are two devices";
}

// Batch norm's split of a channel over blocks: a function of the shape alone (the reduction
// order, so the result, must not depend on the GPU), whole samples per block, scratch bounded.
TEST(CudaRulesTest, BatchNormPartsFillTheGpuWithoutTinyBlocks) {
  EXPECT_EQ(BatchNormParts(256, 64, 32 * 32), 8) << "resnet18_cifar's first layers";
  EXPECT_EQ(BatchNormParts(256, 512, 4 * 4), 1) << "enough channels";
  EXPECT_EQ(BatchNormParts(17, 3, 48 * 48), 9);
  EXPECT_EQ(BatchNormParts(128, 2, 8 * 8), 2);
  EXPECT_EQ(BatchNormParts(2, 1, 1 << 20), 2) << "never more parts than samples";
  EXPECT_EQ(BatchNormParts(64, 8, 16), 1) << "at least 4096 elements a block";
  for (int64_t c : {1, 3, 64, 1000, 4096}) {
    EXPECT_LE(c * BatchNormParts(1 << 16, c, 1 << 10), c + 512) << c;
  }
}

// The channels-last batch norm's split of the rows: a function of the shape alone, about 1024
// blocks of 32 channels, at least 64 rows a part, within the grid's y; the scratch it needs is
// 2 * c * parts doubles.
TEST(CudaRulesTest, BatchNormNhwcPartsFillTheGpuWithinTheGrid) {
  EXPECT_EQ(BatchNormNhwcParts(256 * 32 * 32, 64), 512) << "resnet18_cifar's first layers";
  EXPECT_EQ(BatchNormNhwcParts(64 * 7 * 7, 2048), 16) << "resnet50's last: 64 channel tiles";
  EXPECT_EQ(BatchNormNhwcParts(100, 3), 1) << "at least 64 rows a part";
  EXPECT_EQ(BatchNormNhwcParts(0, 64), 1);
  EXPECT_EQ(BatchNormNhwcParts(1 << 30, 1), 1024);
  for (int64_t c : {1, 31, 32, 33, 1000, 100000}) {
    const int64_t parts = BatchNormNhwcParts(int64_t{1} << 24, c);
    EXPECT_GE(parts, 1) << c;
    EXPECT_LE(parts, 65535) << c;
    const int64_t tiles = (c + 31) / 32;
    EXPECT_LE(tiles * parts, 1024 + tiles) << c << ": about 1024 blocks, one part at least";
    EXPECT_EQ(BatchNormNhwcScratch(int64_t{1} << 24, c), 2 * c * (parts + 1)) << c;
  }
}

// A cuDNN status that refuses the operands (the NOT_SUPPORTED and BAD_PARAM families, cuDNN 9's
// sub-codes included) lets the caller try another way (NCHW instead of NHWC, the plain call
// instead of the fused one); a failure while running does not, and throws CudnnRefusal only for
// the former.
TEST(CudaRulesTest, CudnnRefusalsAreTheNotSupportedAndBadParamFamilies) {
  // cudnn_graph.h's values (this test does not include cuDNN's headers): NOT_SUPPORTED 3000,
  // _SHAPE 3002, _LAYOUT 3004; BAD_PARAM 2000, _NULL_POINTER 2002; NOT_INITIALIZED 1001,
  // INTERNAL_ERROR 4000, _DEVICE_ALLOCATION_FAILED 4004, EXECUTION_FAILED 5000.
  for (const int s : {3000, 3002, 3004, 2000, 2002}) EXPECT_TRUE(detail::CudnnRefused(s)) << s;
  for (const int s : {1001, 4000, 4004, 5000}) EXPECT_FALSE(detail::CudnnRefused(s)) << s;
  const auto refuse = [] { DPT_CUDNN_CHECK(3004); };
  const auto fail = [] { DPT_CUDNN_CHECK(5000); };
  EXPECT_THROW(refuse(), CudnnRefusal);
  EXPECT_THROW(fail(), CudnnError);
  try {
    fail();
  } catch (const CudnnRefusal&) {
    ADD_FAILURE() << "a failure while running is not a refusal";
  } catch (const CudnnError&) {
  }
}

}  // namespace
}  // namespace dptrain::cuda
