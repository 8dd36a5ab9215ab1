// SPDX-License-Identifier: Apache-2.0
// How the launcher's device communicator ends (DeviceCommunicatorGuard): gracefully when the run
// finishes, aborted when an exception unwinds past it, so that the error is printed before
// anything waits for peers (issue 13, point 2). A fake communicator stands in for NCCL: its
// destructor records a graceful finalize (a wait for every peer) unless it was aborted first.
#include "runtime/comm/device_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace dptrain {
namespace {

using ::testing::ElementsAre;

// What happened, in order.
struct Log {
  std::vector<std::string> events;
  bool aborted = false;
};

class FakeDeviceComm final : public Communicator {
 public:
  explicit FakeDeviceComm(Log* log) : log_(log) {}
  ~FakeDeviceComm() override {
    // NCCL's graceful end (ncclCommFinalize) completes only once every rank is quiescent: a wait.
    log_->events.push_back(log_->aborted ? "destroy (aborted, no wait)" : "finalize (waits)");
  }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "fake-nccl"; }
  void AllReduce(Tensor*, ReduceOp) override {}
  std::unique_ptr<CommHandle> AllReduceAsync(Tensor*, ReduceOp) override { return nullptr; }
  void Broadcast(Tensor*, int) override {}
  void AllGather(const Tensor&, Tensor*) override {}
  std::unique_ptr<CommHandle> ReduceScatterAsync(Tensor*, ReduceOp) override { return nullptr; }
  std::unique_ptr<CommHandle> AllGatherAsync(Tensor*) override { return nullptr; }
  std::unique_ptr<Communicator> Split(int) override { return nullptr; }

 private:
  Log* log_;
};

DeviceCommunicatorGuard::AbortFn AbortInto(Log* log) {
  return [log] {
    log->events.push_back("abort");
    log->aborted = true;
  };
}

// The shape of RunTrainOrEval: the communicator lives inside the try, the catch prints.
void RunLikeTheLauncher(Log* log, bool fail) {
  try {
    DeviceCommunicatorGuard comm(std::make_unique<FakeDeviceComm>(log), AbortInto(log));
    ASSERT_NE(comm.get(), nullptr);
    if (fail) DPT_THROW(DataError) << "label 11 out of range [0, 10) on this rank only";
  } catch (const Error& e) {
    log->events.push_back(std::string("print: ") + e.what());
  }
}

TEST(DeviceCommunicatorGuardTest, NormalEndFinalizesGracefully) {
  Log log;
  RunLikeTheLauncher(&log, /*fail=*/false);
  EXPECT_THAT(log.events, ElementsAre("finalize (waits)"));
}

TEST(DeviceCommunicatorGuardTest, UnwindingAbortsAndTheErrorIsPrintedBeforeAnyWait) {
  Log log;
  RunLikeTheLauncher(&log, /*fail=*/true);
  ASSERT_EQ(log.events.size(), 3u);
  EXPECT_EQ(log.events[0], "abort");
  EXPECT_EQ(log.events[1], "destroy (aborted, no wait)");
  EXPECT_THAT(log.events[2], ::testing::StartsWith("print: "));
  EXPECT_THAT(log.events[2], ::testing::HasSubstr("label 11 out of range"));
}

TEST(DeviceCommunicatorGuardTest, NoCommunicatorNothingToAbort) {
  Log log;
  try {
    DeviceCommunicatorGuard none(nullptr, AbortInto(&log));
    EXPECT_EQ(none.get(), nullptr);
    throw std::runtime_error("cpu run fails");
  } catch (const std::exception&) {
  }
  EXPECT_TRUE(log.events.empty()) << "a CPU run has no device communicator to abort";
}

// A guard that lives entirely inside a destructor running during unwinding (an exception was
// already in flight when it was made) is not itself being unwound: it ends gracefully.
struct MakesAGuardWhileUnwinding {
  Log* log;
  ~MakesAGuardWhileUnwinding() {
    DeviceCommunicatorGuard inner(std::make_unique<FakeDeviceComm>(log), AbortInto(log));
  }
};

TEST(DeviceCommunicatorGuardTest, GuardMadeDuringUnwindingEndsGracefully) {
  Log log;
  try {
    MakesAGuardWhileUnwinding m{&log};
    throw std::runtime_error("outer");
  } catch (const std::exception&) {
  }
  EXPECT_THAT(log.events, ElementsAre("finalize (waits)"));
}

TEST(DeviceCommunicatorGuardTest, DestroyedInsideACatchHandlerEndsGracefully) {
  // Once the exception is caught, it is no longer in flight: a communicator released in the
  // handler (after the error was reported) is not being unwound.
  Log log;
  auto comm = std::make_unique<DeviceCommunicatorGuard>(std::make_unique<FakeDeviceComm>(&log),
                                                        AbortInto(&log));
  try {
    throw std::runtime_error("handled");
  } catch (const std::exception&) {
    comm.reset();
  }
  EXPECT_THAT(log.events, ElementsAre("finalize (waits)"));
}

}  // namespace
}  // namespace dptrain
