// SPDX-License-Identifier: Apache-2.0
// Issue 63, without a GPU: the monitor that aborts a collective whose deadline passed while the
// main thread is blocked elsewhere (DeadlineMonitor), the deadline on the last abort before
// MPI_Abort (CallWithDeadline), and the sharded reducer over a delaying fake communicator whose
// collectives finish late on a thread of their own (a missing wait, or a scratch block reused
// while its collective still writes it, gives wrong gradients every time), with a "hang" mode
// that only the monitor's deadline ends.
#include "runtime/comm/deadline_monitor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/backend_registry.h"
#include "core/error.h"
#include "models/model.h"
#include "models/zoo/zoo.h"
#include "runtime/comm/sharded_reducer.h"
#include "tests/testing/backends.h"

namespace dptrain {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(DeadlineMonitorTest, FinishedInTimeNeverFires) {
  DeadlineMonitor m;
  std::atomic<int> fired{0};
  const auto id = m.Watch(Clock::now() + milliseconds(100), [&] { ++fired; });
  EXPECT_EQ(m.in_flight(), 1u);
  m.Done(id);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(fired.load(), 0);
  EXPECT_EQ(m.in_flight(), 0u);
  EXPECT_EQ(m.expired(), 0);
}

// The main thread is blocked in a call that only the abort releases (as cudaFree waits for an
// NCCL kernel that exits on ncclCommAbort): the deadline still ends it, in time and in order.
TEST(DeadlineMonitorTest, AHangIsAbortedAtItsDeadlineWhileTheMainThreadIsBlocked) {
  DeadlineMonitor m;
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  std::vector<int> order;
  const auto start = Clock::now();
  m.Watch(start + milliseconds(300), [&] {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(2);
    aborted = true;
    cv.notify_all();
  });
  m.Watch(start + milliseconds(150), [&] {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(1);
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return aborted; });  // "blocked in cudaFree"
  const double waited = Since(start);
  EXPECT_GE(waited, 0.29);
  EXPECT_LT(waited, 1.0) << "the abort came late";
  EXPECT_EQ(order, (std::vector<int>{1, 2})) << "deadlines fire in their order";
  EXPECT_EQ(m.expired(), 2);
}

TEST(DeadlineMonitorTest, CallWithDeadlineGivesUpOnAHungCall) {
  EXPECT_TRUE(CallWithDeadline([] {}, 5.0));
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  const auto start = Clock::now();
  // ncclCommAbort stuck in network teardown: MPI_Abort must not wait for it.
  EXPECT_FALSE(CallWithDeadline([released] { released.wait(); }, 0.2));
  EXPECT_LT(Since(start), 1.0);
  release.set_value();  // let the detached thread end
}

// ---- the sharded reducer over a delaying fake communicator ----

// One rank (0) of `size`, every peer holding the same gradients: a reduce-scatter makes chunk 0
// `size` times its value. Each collective finishes on a thread of its own after `delay`; in hang
// mode it never does until the monitor's deadline aborts the communicator.
class DelayingComm final : public Communicator {
 public:
  DelayingComm(int size, milliseconds delay, bool hang, double timeout_s)
      : size_(size), delay_(delay), hang_(hang), timeout_s_(timeout_s) {}
  ~DelayingComm() override { Abort(); }
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string name() const override { return "delaying-fake"; }
  void AllReduce(Tensor*, ReduceOp) override {}
  std::unique_ptr<CommHandle> AllReduceAsync(Tensor*, ReduceOp) override { return nullptr; }
  void Broadcast(Tensor*, int) override {}
  void AllGather(const Tensor&, Tensor*) override {}
  std::unique_ptr<Communicator> Split(int) override { return nullptr; }
  std::unique_ptr<CommHandle> AllGatherAsync(Tensor* t) override {
    return Launch(*t, [](float*, int64_t) {});  // every rank has the same chunks
  }
  std::unique_ptr<CommHandle> ReduceScatterAsync(Tensor* t, ReduceOp) override {
    const int n = size_;
    return Launch(*t, [n](float* chunk, int64_t len) {
      for (int64_t i = 0; i < len; ++i) chunk[i] *= static_cast<float>(n);
    });
  }
  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  int launched() const { return launched_; }

 private:
  class Handle final : public CommHandle {
   public:
    Handle(DelayingComm* c, std::future<bool> done, DeadlineMonitor::Id id)
        : comm_(c), done_(std::move(done)), id_(id) {}
    ~Handle() override {
      if (done_.valid()) done_.wait();
      DeadlineMonitor::Shared().Done(id_);
    }
    void Wait() override {
      if (!done_.valid()) return;
      const bool ok = done_.get();
      DeadlineMonitor::Shared().Done(id_);
      DPT_CHECK_AS(CommError, ok) << "fake reduce-scatter aborted at its deadline";
      (void)comm_;
    }
    bool Test() override {
      if (!done_.valid()) return true;
      if (done_.wait_for(milliseconds(0)) != std::future_status::ready) return false;
      Wait();
      return true;
    }

   private:
    DelayingComm* comm_;
    std::future<bool> done_;
    DeadlineMonitor::Id id_;
  };

  template <class Op>
  std::unique_ptr<CommHandle> Launch(const Tensor& t, Op op) {
    ++launched_;
    float* chunk = t.data<float>();  // rank 0's chunk is the first
    const int64_t len = t.numel() / size_;
    std::promise<bool> p;
    auto done = p.get_future();
    std::thread([this, chunk, len, op, p = std::move(p)]() mutable {
      bool ok = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        // Sleep, or (hang) wait for the abort.
        ok = !cv_.wait_for(lock, hang_ ? milliseconds(3600000) : delay_, [&] { return aborted_; });
        if (ok) op(chunk, len);
      }
      p.set_value(ok);  // the last touch: the communicator may be gone right after
    }).detach();
    const auto id = DeadlineMonitor::Shared().Watch(
        Clock::now() +
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_)),
        [this] { Abort(); });
    return std::make_unique<Handle>(this, std::move(done), id);
  }

  int size_;
  milliseconds delay_;
  bool hang_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool aborted_ = false;
  int launched_ = 0;
};

// The gradients of one backward of resnet8, unsharded, by parameter name.
std::map<std::string, std::vector<float>> PlainGradients(Backend& be, const Tensor& x,
                                                         const Tensor& dout) {
  Model m(be, BuildZooModel(be, "resnet8", 10), Shape{3, 32, 32});
  m.Setup(2, Precision::kF32);
  m.InitParams(7);
  ForwardContext ctx;
  ctx.training = true;
  m.Forward(x, ctx);
  m.Backward(dout, false);
  std::map<std::string, std::vector<float>> out;
  for (const auto& g : m.named_grads()) out[g.name] = testing::ToHost(be, g.tensor);
  return out;
}

// What the float at `flat` of a sharded model's layout should hold: the plain gradient of the
// parameter there (0 in padding).
float Expected(const Model& m, const std::map<std::string, std::vector<float>>& plain,
               int64_t flat) {
  for (const auto& p : m.named_params()) {
    if (flat >= p.offset && flat < p.offset + p.tensor.numel()) {
      return plain.at(p.name)[static_cast<size_t>(flat - p.offset)];
    }
  }
  return 0.f;
}

TEST(ShardedReducerDelayTest, LateCollectivesGiveTheRightGradients) {
  Backend& be = GetBackend("cpu");
  const int world = 4;
  const Tensor x = testing::ToDevice(be, testing::RandomUniform(2 * 3 * 32 * 32, 3, -1.f, 1.f),
                                     Shape{2, 3, 32, 32});
  const Tensor dout =
      testing::ToDevice(be, testing::RandomUniform(2 * 10, 4, -1.f, 1.f), Shape{2, 10});
  const auto plain = PlainGradients(be, x, dout);
  for (ShardMode mode : {ShardMode::kOptimizer, ShardMode::kGradients}) {
    SCOPED_TRACE(mode == ShardMode::kOptimizer ? "optimizer" : "gradients");
    Model m(be, BuildZooModel(be, "resnet8", 10), Shape{3, 32, 32});
    FlatLayout layout = ShardedFlatLayout(mode, world, size_t{64} << 10);
    layout.first_group_floats = 1024;  // several groups in a model this small
    m.Setup(2, Precision::kF32, layout);
    ASSERT_GT(m.groups().size(), 3u);
    m.InitParams(7);
    DelayingComm comm(world, milliseconds(20), /*hang=*/false, 30.0);
    ShardedReducer r(be, comm, m, mode);
    ForwardContext ctx;
    ctx.training = true;
    m.Forward(x, ctx);
    r.Begin(false);
    m.Backward(
        dout, false, [&](int64_t n) { r.OnReady(n); }, [&](size_t c) { r.OnChildStart(c); });
    r.Finish();
    EXPECT_EQ(comm.launched(), static_cast<int>(m.groups().size()));
    // This rank's chunks: 4 x the plain gradients (every peer sent the same), each group's.
    const auto owned = r.OwnedGrads();
    double worst = 0;
    for (size_t g = 0; g < owned.size(); ++g) {
      const std::vector<float> got = testing::ToHost(be, owned[g]);
      const int64_t begin = m.groups()[g].first;  // rank 0 owns each group's first chunk
      for (size_t i = 0; i < got.size(); ++i) {
        const float want =
            static_cast<float>(world) * Expected(m, plain, begin + static_cast<int64_t>(i));
        worst = std::max(worst, static_cast<double>(std::abs(got[i] - want)));
      }
    }
    EXPECT_LE(worst, 1e-5) << "a chunk was read before its collective finished, or a block "
                              "was reused while a collective still wrote it";
  }
}

TEST(ShardedReducerDelayTest, AHungCollectiveEndsAtItsDeadline) {
  Backend& be = GetBackend("cpu");
  Model m(be, BuildZooModel(be, "resnet8", 10), Shape{3, 32, 32});
  m.Setup(2, Precision::kF32, ShardedFlatLayout(ShardMode::kGradients, 4, size_t{64} << 10));
  m.InitParams(7);
  DelayingComm comm(4, milliseconds(0), /*hang=*/true, 0.3);
  ShardedReducer r(be, comm, m, ShardMode::kGradients);
  const Tensor x = testing::ToDevice(be, testing::RandomUniform(2 * 3 * 32 * 32, 3, -1.f, 1.f),
                                     Shape{2, 3, 32, 32});
  const Tensor dout =
      testing::ToDevice(be, testing::RandomUniform(2 * 10, 4, -1.f, 1.f), Shape{2, 10});
  ForwardContext ctx;
  ctx.training = true;
  m.Forward(x, ctx);
  const auto start = Clock::now();
  r.Begin(false);
  EXPECT_THROW(
      {
        m.Backward(
            dout, false, [&](int64_t n) { r.OnReady(n); }, [&](size_t c) { r.OnChildStart(c); });
        r.Finish();
      },
      CommError);
  EXPECT_LT(Since(start), 3.0) << "the deadline (0.3 s) did not end the hang";
}

}  // namespace
}  // namespace dptrain
