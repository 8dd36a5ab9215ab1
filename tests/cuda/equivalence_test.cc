// SPDX-License-Identifier: Apache-2.0
// GPU-only, 2 ranks (label cuda): data-parallel training on 2 GPUs is training on 1 GPU. Every
// rank runs the reference (ref_cnn, global batch 32 on its own GPU) and the data-parallel run
// (16 samples per rank, gradients summed by the NCCL communicator through the bucketed Reducer
// while backward runs, as the trainer does, and scaled by 1 / world in the optimizer); after a
// few SGD steps the parameters agree within the cross-backend tolerance, and the data-parallel
// replicas are bit-identical across ranks. The same with dist.shard = optimizer and gradients
// (ncclReduceScatter / ncclAllGather in place, through the ShardedReducer).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/backend_registry.h"
#include "models/loss.h"
#include "models/model.h"
#include "models/zoo/zoo.h"
#include "runtime/comm/device_communicator.h"
#include "runtime/comm/reducer.h"
#include "runtime/comm/sharded_reducer.h"
#include "runtime/optim/optimizer.h"
#include "tests/cuda/gpu_test_env.h"
#include "tests/testing/backends.h"
#include "tests/testing/mpi_testing.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

constexpr int64_t kGlobalBatch = 32;
constexpr int kSteps = 5;

// Trains ref_cnn for kSteps on the global batch's samples [begin, begin + n) with `reducer_comm`
// summing gradients (null: a single process), sharded per `shard`. Returns the final parameters,
// one after the other in named order.
std::vector<float> TrainRefCnn(Backend& be, Communicator* reducer_comm, int64_t begin, int64_t n,
                               const std::vector<float>& images, const std::vector<int32_t>& labels,
                               ShardMode shard = ShardMode::kNone) {
  const Shape in = DefaultInputShape("ref_cnn");
  Model m(be, BuildZooModel(be, "ref_cnn", 10), in);
  const int world = reducer_comm != nullptr ? reducer_comm->size() : 1;
  const bool sharded = shard != ShardMode::kNone && world > 1;
  m.Setup(n, Precision::kF32, ShardedFlatLayout(shard, world, size_t{256} << 10));
  m.InitParams(42);
  Loss loss(be, LossKind::kCrossEntropy, m.output_shape());
  OptimizerConfig oc;
  oc.momentum = 0.9;
  oc.weight_decay = 5e-4;
  std::unique_ptr<ShardedReducer> sharder;
  if (sharded) sharder = std::make_unique<ShardedReducer>(be, *reducer_comm, m, shard);
  Optimizer opt(be, oc, m.params(), sharder ? &sharder->layout() : nullptr);
  std::unique_ptr<Reducer> reducer;
  if (reducer_comm != nullptr && !sharded) {
    reducer =
        std::make_unique<Reducer>(*reducer_comm, m.grads(), size_t{256} << 10, size_t{64} << 10);
  }
  const int64_t per = in.numel();
  const std::vector<float> x(images.begin() + begin * per, images.begin() + (begin + n) * per);
  const std::vector<int32_t> y(labels.begin() + begin, labels.begin() + begin + n);
  const Tensor xt = ToDevice(be, x, Shape{n, in[0], in[1], in[2]});
  const Tensor yt = ToDeviceI32(be, y, {n});
  for (int step = 0; step < kSteps; ++step) {
    ForwardContext ctx;
    ctx.training = true;
    ctx.step = step;
    const Tensor& out = m.Forward(xt, ctx);
    loss.Forward(out, yt);
    const Tensor& dout = loss.Backward(out, yt, n);  // mean over this rank's samples
    const float scale = 1.f / static_cast<float>(world);
    if (sharder) {
      sharder->Begin(false);
      m.Backward(
          dout, false, [&](int64_t ready) { sharder->OnReady(ready); },
          [&](size_t c) { sharder->OnChildStart(c); });
      sharder->Finish();
      opt.StepShard(&m.params(), sharder->step_grads(), 0.05f, scale,
                    [&](size_t g) { sharder->GatherParamsAsync(g); });
      sharder->WaitParams();
      continue;
    }
    if (reducer) {
      reducer->Begin();
      m.Backward(dout, false, [&](int64_t ready) { reducer->OnReady(ready); });
      reducer->Finish();
    } else {
      m.Backward(dout, false);
    }
    opt.Step(&m.params(), m.grads(), 0.05f, scale);
  }
  // Parameter by parameter: the sharded layout pads each group, so flat offsets differ.
  const std::vector<float> flat = ToHost(be, m.params());
  std::vector<float> out;
  for (const auto& p : m.named_params()) {
    const auto at = flat.begin() + p.offset;
    out.insert(out.end(), at, at + p.tensor.numel());
  }
  return out;
}

TEST(CudaEquivalenceTest, TwoGpusTrainLikeOne) {
  MpiCommunicator& world = WorldComm();
  const GpuRank gpu = BindGpuForTest(world);
  if (gpu.backend == nullptr) GTEST_SKIP() << gpu.why_not;
  Backend& be = *gpu.backend;
  if (kGlobalBatch % world.size() != 0) GTEST_SKIP() << "needs a world size dividing 32";
  const int64_t per = DefaultInputShape("ref_cnn").numel();
  const std::vector<float> images =
      RandomUniform(static_cast<size_t>(kGlobalBatch * per), 1234, -1.f, 1.f);
  const std::vector<int32_t> labels = RandomLabels(kGlobalBatch, 10, 1235);

  const std::vector<float> single = TrainRefCnn(be, nullptr, 0, kGlobalBatch, images, labels);
  auto nccl = CreateDeviceCommunicator(be, world, 60.0);
  const int64_t b = kGlobalBatch / world.size();
  for (ShardMode shard : {ShardMode::kNone, ShardMode::kOptimizer, ShardMode::kGradients}) {
    const std::vector<float> dp =
        TrainRefCnn(be, nccl.get(), world.rank() * b, b, images, labels, shard);
    const auto close = AllClose(dp, ToDouble(single), kCrossBackendTol);
    // Replicas: every rank holds the same parameters, bit for bit.
    double sums[2] = {0, 0};
    for (float v : dp) sums[0] += static_cast<double>(v) * v;
    sums[1] = -sums[0];
    world.AllReduceHost(sums, 2, ReduceOp::kMax);
    const bool replicas = sums[0] == -sums[1];
    ASSERT_TRUE(AllRanksOk(world, static_cast<bool>(close) && replicas))
        << "dist.shard = " << static_cast<int>(shard) << ": " << close.message()
        << (replicas ? "" : "; the replicas differ across ranks");
  }
  nccl.reset();
}

}  // namespace
}  // namespace dptrain::testing
