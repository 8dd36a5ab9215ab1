// SPDX-License-Identifier: Apache-2.0
// GPU-only, 2 ranks (label cuda): data-parallel training on 2 GPUs is training on 1 GPU. Every
// rank runs the reference on its own GPU and the data-parallel run (16 samples per rank,
// gradients summed by the NCCL communicator through the bucketed Reducer while backward runs, as
// the trainer does, and scaled by 1 / world in the optimizer); after a few SGD steps the
// parameters agree within the cross-backend tolerance, and the data-parallel replicas are
// bit-identical across ranks. The same with dist.shard = optimizer and gradients
// (ncclReduceScatter / ncclAllGather in place, through the ShardedReducer). Two models: ref_cnn
// (reference: one batch of 32) and resnet8 (batch norm, residual adds; batch norm normalises over
// each rank's own samples, so the reference accumulates the gradients of two micro-batches of
// 16, the samples each rank holds).
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

// Trains zoo model `name` for kSteps on the global batch's samples [begin, begin + n), in
// micro-batches of `micro` whose gradients add up, with `reducer_comm` summing gradients (null: a
// single process), sharded per `shard`. Returns the final parameters, one after the other in
// named order.
std::vector<float> Train(Backend& be, const std::string& name, Communicator* reducer_comm,
                         int64_t begin, int64_t n, int64_t micro, const std::vector<float>& images,
                         const std::vector<int32_t>& labels, ShardMode shard = ShardMode::kNone) {
  const Shape in = DefaultInputShape(name);
  Model m(be, BuildZooModel(be, name, 10), in);
  const int world = reducer_comm != nullptr ? reducer_comm->size() : 1;
  const bool sharded = shard != ShardMode::kNone && world > 1;
  // One process accumulates its micro-batches as ranks do: the optimizer scales by 1 / (its
  // micro-batches x the ranks), each micro-batch's loss a mean over its own samples.
  const int64_t micros = n / micro;
  m.Setup(micro, Precision::kF32, ShardedFlatLayout(shard, world, size_t{256} << 10));
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
  std::vector<Tensor> xs, ys;
  for (int64_t k = 0; k < micros; ++k) {
    const int64_t at = begin + k * micro;
    const std::vector<float> x(images.begin() + at * per, images.begin() + (at + micro) * per);
    const std::vector<int32_t> y(labels.begin() + at, labels.begin() + at + micro);
    xs.push_back(ToDevice(be, x, Shape{micro, in[0], in[1], in[2]}));
    ys.push_back(ToDeviceI32(be, y, {micro}));
  }
  for (int step = 0; step < kSteps; ++step) {
    ForwardContext ctx;
    ctx.training = true;
    ctx.step = step;
    const float scale = 1.f / static_cast<float>(world * micros);
    if (micros > 1) {  // the reference: a single process, micro-batches accumulated
      for (int64_t k = 0; k < micros; ++k) {
        const Tensor& out = m.Forward(xs[k], ctx);
        loss.Forward(out, ys[k]);
        m.Backward(loss.Backward(out, ys[k], micro), k > 0);
      }
      opt.Step(&m.params(), m.grads(), 0.05f, scale);
      continue;
    }
    const Tensor& out = m.Forward(xs[0], ctx);
    loss.Forward(out, ys[0]);
    const Tensor& dout = loss.Backward(out, ys[0], n);  // mean over this rank's samples
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

// `name` on 1 GPU against 2 (or more) ranks, each shard mode; `per_rank_reference`: the
// reference runs each rank's samples as a micro-batch (batch norm).
void ExpectDataParallelTrainsLikeOne(const std::string& name, bool per_rank_reference) {
  MpiCommunicator& world = WorldComm();
  static const GpuRank gpu = BindGpuForTest(world);  // once per process
  if (gpu.backend == nullptr) GTEST_SKIP() << gpu.why_not;
  Backend& be = *gpu.backend;
  if (kGlobalBatch % world.size() != 0) GTEST_SKIP() << "needs a world size dividing 32";
  const int64_t per = DefaultInputShape(name).numel();
  const std::vector<float> images =
      RandomUniform(static_cast<size_t>(kGlobalBatch * per), 1234, -1.f, 1.f);
  const std::vector<int32_t> labels = RandomLabels(kGlobalBatch, 10, 1235);

  const int64_t b = kGlobalBatch / world.size();
  const std::vector<float> single = Train(be, name, nullptr, 0, kGlobalBatch,
                                          per_rank_reference ? b : kGlobalBatch, images, labels);
  auto nccl = CreateDeviceCommunicator(be, world, 60.0);
  for (ShardMode shard : {ShardMode::kNone, ShardMode::kOptimizer, ShardMode::kGradients}) {
    const std::vector<float> dp =
        Train(be, name, nccl.get(), world.rank() * b, b, b, images, labels, shard);
    const auto close = AllClose(dp, ToDouble(single), kCrossBackendTol);
    // Replicas: every rank holds the same parameters, bit for bit.
    double sums[2] = {0, 0};
    for (float v : dp) sums[0] += static_cast<double>(v) * v;
    sums[1] = -sums[0];
    world.AllReduceHost(sums, 2, ReduceOp::kMax);
    const bool replicas = sums[0] == -sums[1];
    ASSERT_TRUE(AllRanksOk(world, static_cast<bool>(close) && replicas))
        << name << ", dist.shard = " << static_cast<int>(shard) << ": " << close.message()
        << (replicas ? "" : "; the replicas differ across ranks");
  }
  nccl.reset();
}

TEST(CudaEquivalenceTest, TwoGpusTrainLikeOne) {
  ExpectDataParallelTrainsLikeOne("ref_cnn", false);
}

// Batch norm and residual adds: each rank's statistics are its own samples' (no SyncBatchNorm),
// as the reference's micro-batches are.
TEST(CudaEquivalenceTest, ResNet8TrainsLikeOneWithPerRankBatchNorm) {
  ExpectDataParallelTrainsLikeOne("resnet8", true);
}

}  // namespace
}  // namespace dptrain::testing
