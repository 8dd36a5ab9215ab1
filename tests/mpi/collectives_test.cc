// SPDX-License-Identifier: Apache-2.0
// MPI communicator and reducer on sizes 0, 1, primes and sizes not divisible by the world size;
// sum/avg/max, async, broadcast, allgather, gather to a root, split; the bucketed reducer sums
// exactly what a plain allreduce sums, whatever the bucket size.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/backend_registry.h"
#include "runtime/comm/reducer.h"
#include "tests/testing/backends.h"
#include "tests/testing/mpi_testing.h"

namespace dptrain {
namespace {

using testing::AllRanksOk;
using testing::WorldComm;

// Value of element i on rank r: distinct per rank, exactly representable sums.
float Val(int r, int64_t i) { return static_cast<float>((r + 1) * 1000 + i % 97); }

class CollectiveSizeTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(CollectiveSizeTest, AllReduceSumAvgMax) {
  MpiCommunicator& comm = WorldComm();
  Backend& be = GetBackend("cpu");
  const int64_t n = GetParam();
  const int w = comm.size(), r = comm.rank();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    Tensor t = be.Empty(Shape{n}, DType::kF32, "t");
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = Val(r, i);
    comm.AllReduce(&t, op);
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int k = 0; k < w; ++k) {
        want = op == ReduceOp::kMax ? std::max(want, double(Val(k, i))) : want + Val(k, i);
      }
      if (op == ReduceOp::kAvg) want /= w;
      ok = ok && std::abs(t.data<float>()[i] - want) <= 1e-6 * std::abs(want);
    }
    ASSERT_TRUE(AllRanksOk(comm, ok))
        << "rank " << r << " op " << static_cast<int>(op) << " n " << n;
  }
}

TEST_P(CollectiveSizeTest, AsyncAllReduceAndBroadcast) {
  MpiCommunicator& comm = WorldComm();
  Backend& be = GetBackend("cpu");
  const int64_t n = GetParam();
  Tensor t = be.Empty(Shape{n}, DType::kF32, "t");
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = Val(comm.rank(), i);
  auto h = comm.AllReduceAsync(&t, ReduceOp::kSum);
  while (!h->Test()) {
  }
  h->Wait();
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (int k = 0; k < comm.size(); ++k) want += Val(k, i);
    ok = ok && t.data<float>()[i] == static_cast<float>(want);
  }
  Tensor b = be.Empty(Shape{n}, DType::kF32, "b");
  for (int64_t i = 0; i < n; ++i) b.data<float>()[i] = Val(comm.rank(), i);
  const int root = comm.size() - 1;
  comm.Broadcast(&b, root);
  for (int64_t i = 0; i < n; ++i) ok = ok && b.data<float>()[i] == Val(root, i);
  ASSERT_TRUE(AllRanksOk(comm, ok)) << "rank " << comm.rank() << " n " << n;
}

TEST_P(CollectiveSizeTest, AllGather) {
  MpiCommunicator& comm = WorldComm();
  Backend& be = GetBackend("cpu");
  const int64_t n = GetParam();
  Tensor in = be.Empty(Shape{n}, DType::kF32, "in");
  Tensor out = be.Empty(Shape{n * comm.size()}, DType::kF32, "out");
  for (int64_t i = 0; i < n; ++i) in.data<float>()[i] = Val(comm.rank(), i);
  comm.AllGather(in, &out);
  bool ok = true;
  for (int k = 0; k < comm.size(); ++k) {
    for (int64_t i = 0; i < n; ++i) ok = ok && out.data<float>()[k * n + i] == Val(k, i);
  }
  ASSERT_TRUE(AllRanksOk(comm, ok)) << "rank " << comm.rank();
}

// 0, 1, primes, not divisible by 3 or 4, larger than an MPI eager message.
INSTANTIATE_TEST_SUITE_P(Sizes, CollectiveSizeTest,
                         ::testing::Values(0, 1, 2, 7, 13, 97, 1021, 65537, 1000003));

TEST(ReducerTest, BucketsSumLikeOneAllReduce) {
  MpiCommunicator& comm = WorldComm();
  Backend& be = GetBackend("cpu");
  for (size_t bucket_bytes : {size_t{4}, size_t{4096}, size_t{40000}, size_t{1} << 26}) {
    // One float per bucket is one collective per float: keep that case small.
    const int64_t n = bucket_bytes < 4096 ? 1009 : 100003;
    Tensor g = be.Empty(Shape{n}, DType::kF32, "grads");
    for (int64_t i = 0; i < n; ++i) g.data<float>()[i] = Val(comm.rank(), i);
    Reducer red(comm, g, bucket_bytes, bucket_bytes / 2 + 4);
    red.Begin();
    // Readiness arrives in uneven pieces, as layers finish.
    for (int64_t ready : {int64_t{10}, int64_t{5000}, int64_t{5001}, int64_t{77777}}) {
      red.OnReady(ready);
    }
    red.Finish();
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int k = 0; k < comm.size(); ++k) want += Val(k, i);
      ok = ok && g.data<float>()[i] == static_cast<float>(want);
    }
    ASSERT_TRUE(AllRanksOk(comm, ok))
        << "bucket " << bucket_bytes << " buckets " << red.num_buckets();
  }
}

TEST(CommTest, SplitAndHostHelpers) {
  MpiCommunicator& comm = WorldComm();
  auto evens = comm.Split(comm.rank() % 2 == 0 ? 0 : -1);
  bool ok = (comm.rank() % 2 == 0) == (evens != nullptr);
  if (evens) ok = ok && evens->size() == (comm.size() + 1) / 2 && evens->rank() == comm.rank() / 2;
  const auto names = comm.AllGatherStrings(std::string(static_cast<size_t>(comm.rank()), 'x'));
  ok = ok && static_cast<int>(names.size()) == comm.size();
  for (int k = 0; k < comm.size(); ++k) ok = ok && names[k].size() == static_cast<size_t>(k);
  double v[2] = {static_cast<double>(comm.rank()), 1.0};
  comm.AllReduceHost(v, 2, ReduceOp::kSum);
  ok = ok && v[1] == comm.size() && v[0] == comm.size() * (comm.size() - 1) / 2.0;
  // GatherHost: rank r's three values land at r * 3 on the root (the metrics gather); the
  // other ranks pass no buffer.
  for (int root : {0, comm.size() - 1}) {
    const double mine[3] = {static_cast<double>(comm.rank()), 0.5, -1.0 * comm.rank()};
    std::vector<double> all(comm.rank() == root ? static_cast<size_t>(3 * comm.size()) : 0);
    comm.GatherHost(mine, 3, all.data(), root);
    for (int k = 0; k < comm.size() && comm.rank() == root; ++k) {
      const auto at = static_cast<size_t>(3 * k);
      ok = ok && all[at] == k && all[at + 1] == 0.5 && all[at + 2] == -1.0 * k;
    }
  }
  ASSERT_TRUE(AllRanksOk(comm, ok)) << "rank " << comm.rank();
  EXPECT_TRUE(comm.AllTrue(true));
  EXPECT_FALSE(comm.AllTrue(comm.rank() != 1));
}

}  // namespace
}  // namespace dptrain
