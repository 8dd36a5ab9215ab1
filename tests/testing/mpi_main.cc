// SPDX-License-Identifier: Apache-2.0
// GoogleTest main for multi-rank tests: MPI up before the tests, gtest's printer on rank 0 only,
// one XML file per rank (--gtest_output=xml:DIR/ gets rank suffixes), --hang-rank=N parks rank N
// in a loop until a debugger sets `dptrain_hang = 0`, and the verdict all-reduced so every rank
// exits with the same code.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "core/error.h"
#include "runtime/comm/mpi_communicator.h"
#include "tests/testing/mpi_testing.h"

namespace {
std::unique_ptr<dptrain::MpiCommunicator> g_world;
}  // namespace

volatile int dptrain_hang = 1;

namespace dptrain::testing {
MpiCommunicator& WorldComm() { return *g_world; }
}  // namespace dptrain::testing

int main(int argc, char** argv) {
  int hang_rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--hang-rank=", 12) == 0) hang_rank = std::atoi(argv[i] + 12);
  }
  dptrain::MpiSession mpi(&argc, &argv);
  g_world = mpi.World();
  const int rank = g_world->rank();
  dptrain::SetProcessContext({rank, g_world->size(), ""});
  if (rank == hang_rank) {
    std::fprintf(stderr, "rank %d (pid %d) waiting for a debugger: set dptrain_hang = 0\n", rank,
                 static_cast<int>(getpid()));
    while (dptrain_hang != 0) sleep(1);
  }
  // One XML report per rank: xml:path.xml -> path.rank<r>.xml
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--gtest_output=xml:", 0) == 0) {
      const auto dot = a.rfind(".xml");
      std::string out = dot == std::string::npos
                            ? a + ".rank" + std::to_string(rank)
                            : a.substr(0, dot) + ".rank" + std::to_string(rank) + ".xml";
      ::testing::GTEST_FLAG(output) = out.substr(std::strlen("--gtest_output="));
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int64_t failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  g_world->AllReduceHost(&failed, 1, dptrain::ReduceOp::kMax);
  g_world.reset();
  return failed != 0 ? 1 : 0;
}
