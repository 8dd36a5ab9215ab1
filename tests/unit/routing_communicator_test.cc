// SPDX-License-Identifier: Apache-2.0
// RoutingCommunicator: collectives on host tensors reach the host communicator, on device
// tensors the device communicator; every control-plane call and Barrier stays on the host one;
// Split splits both.
#include "runtime/comm/routing_communicator.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace dptrain {
namespace {

// Records which calls reached it.
class RecordingComm final : public Communicator {
 public:
  explicit RecordingComm(std::string name, std::vector<std::string>* log)
      : name_(std::move(name)), log_(log) {}
  int rank() const override { return 1; }
  int size() const override { return 4; }
  std::string name() const override { return name_; }
  void AllReduce(Tensor*, ReduceOp) override { Log("allreduce"); }
  std::unique_ptr<CommHandle> AllReduceAsync(Tensor*, ReduceOp) override {
    Log("allreduce_async");
    return nullptr;
  }
  void Broadcast(Tensor*, int) override { Log("broadcast"); }
  void AllGather(const Tensor&, Tensor*) override { Log("allgather"); }
  void Barrier() override { Log("barrier"); }
  void AllReduceHost(double*, int, ReduceOp) override { Log("allreduce_host"); }
  void AllReduceHost(int64_t*, int, ReduceOp) override { Log("allreduce_host"); }
  void BroadcastHost(void*, size_t, int) override { Log("broadcast_host"); }
  std::vector<std::string> AllGatherStrings(const std::string&) override {
    Log("allgather_strings");
    return {};
  }
  std::unique_ptr<Communicator> Split(int color) override {
    Log("split");
    if (color < 0) return nullptr;
    return std::make_unique<RecordingComm>(name_ + "/sub", log_);
  }

 private:
  void Log(const std::string& what) { log_->push_back(name_ + ":" + what); }
  std::string name_;
  std::vector<std::string>* log_;
};

// A tensor that claims to live on `device` (never dereferenced here).
Tensor Fake(Device device) {
  static float storage[4];
  return Tensor(std::make_shared<Buffer>(nullptr, storage, sizeof storage, device, "fake"),
                Shape{4}, DType::kF32);
}

TEST(RoutingCommunicatorTest, RoutesByTheTensorsDevice) {
  std::vector<std::string> log;
  RecordingComm host("mpi", &log), device("nccl", &log);
  RoutingCommunicator c(host, device);
  EXPECT_EQ(c.name(), "mpi+nccl");
  EXPECT_EQ(c.rank(), 1);
  EXPECT_EQ(c.size(), 4);
  Tensor h = Fake(Device::kCpu), d = Fake(Device::kCuda);
  c.AllReduce(&d, ReduceOp::kSum);
  c.AllReduceAsync(&d, ReduceOp::kSum);
  c.Broadcast(&d, 0);
  c.AllGather(d, &d);
  c.AllReduce(&h, ReduceOp::kSum);
  c.Broadcast(&h, 0);
  c.Barrier();
  double v = 0;
  int64_t i = 0;
  c.AllReduceHost(&v, 1, ReduceOp::kSum);
  c.AllReduceHost(&i, 1, ReduceOp::kMax);
  c.BroadcastHost(&v, sizeof v, 0);
  c.AllGatherStrings("x");
  const std::vector<std::string> want = {
      "nccl:allreduce",     "nccl:allreduce_async", "nccl:broadcast",       "nccl:allgather",
      "mpi:allreduce",      "mpi:broadcast",        "mpi:barrier",          "mpi:allreduce_host",
      "mpi:allreduce_host", "mpi:broadcast_host",   "mpi:allgather_strings"};
  EXPECT_EQ(log, want);
  EXPECT_THROW(c.AllGather(h, &d), InternalError) << "host to device is no collective";
}

TEST(RoutingCommunicatorTest, SplitSplitsBoth) {
  std::vector<std::string> log;
  RecordingComm host("mpi", &log), device("nccl", &log);
  RoutingCommunicator c(host, device);
  auto sub = c.Split(0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->name(), "mpi/sub+nccl/sub");
  EXPECT_EQ(c.Split(-1), nullptr);
  EXPECT_EQ(log, (std::vector<std::string>{"mpi:split", "nccl:split", "mpi:split", "nccl:split"}));
}

}  // namespace
}  // namespace dptrain
