// SPDX-License-Identifier: Apache-2.0
// The replica divergence check: identical parameters pass; one flipped value on one rank stops
// every rank with the same message naming the step and the odd rank out.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/backend_registry.h"
#include "core/error.h"
#include "runtime/comm/replica_check.h"
#include "tests/testing/mpi_testing.h"

namespace dptrain {
namespace {

using testing::AllRanksOk;
using testing::WorldComm;

Tensor Params(Backend& be) {
  Tensor t = be.Empty(Shape{1001}, DType::kF32, "params");
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.001f * static_cast<float>(i);
  return t;
}

TEST(ReplicaCheckTest, IdenticalReplicasPass) {
  Backend& be = GetBackend("cpu");
  Tensor p = Params(be);
  bool ok = true;
  try {
    CheckReplicasIdentical(WorldComm(), be, p, 7);
  } catch (const Error&) {
    ok = false;
  }
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok));
}

TEST(ReplicaCheckTest, OneFlippedValueNamesTheRankOnEveryRank) {
  Backend& be = GetBackend("cpu");
  Tensor p = Params(be);
  // Test-only fault: rank 1 flips the lowest bit of one parameter.
  if (WorldComm().rank() == 1) {
    uint32_t bits;
    std::memcpy(&bits, p.data<float>() + 500, 4);
    bits ^= 1u;
    std::memcpy(p.data<float>() + 500, &bits, 4);
  }
  std::string msg;
  int code = 0;
  try {
    CheckReplicasIdentical(WorldComm(), be, p, 1200);
  } catch (const Error& e) {
    msg = e.what();
    code = e.exit_code();
  }
  const bool ok = code == 70 && msg.find("diverged at step 1200") != std::string::npos &&
                  msg.find("ranks 1 hold checksum") != std::string::npos;
  ASSERT_TRUE(AllRanksOk(WorldComm(), ok)) << "rank " << WorldComm().rank() << ": " << msg;
}

}  // namespace
}  // namespace dptrain
