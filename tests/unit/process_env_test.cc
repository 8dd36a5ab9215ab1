// SPDX-License-Identifier: Apache-2.0
// The launcher's environment variables, read through an injected getenv: local rank and size
// (precedence, strict parsing), and world rank / size before MPI_Init (Open MPI, PMI, PMIx and
// Slurm spellings; malformed values count as absent and never throw).
#include "launcher/process_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace dptrain {
namespace {

using ::testing::HasSubstr;

// A fake environment: the variables Set, nothing else.
class FakeEnv {
 public:
  // By value and moved: assigning a literal to a std::string trips GCC 12's false -Wrestrict at
  // -O3 (GCC bug 105329).
  void Set(const std::string& name, std::string value) { vars_[name] = std::move(value); }
  GetEnvFn Fn() {
    return [this](const char* n) -> const char* {
      const auto it = vars_.find(n);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

TEST(ProcessEnvTest, LocalRankFollowsPrecedence) {
  FakeEnv env;
  EXPECT_FALSE(ReadLauncherVars(env.Fn()).local_rank.has_value());
  env.Set("SLURM_LOCALID", "0");
  env.Set("PMI_LOCAL_RANK", "2");
  env.Set("PMI_LOCAL_SIZE", "4");
  LauncherVars v = ReadLauncherVars(env.Fn());
  EXPECT_EQ(v.local_rank, 2) << "SLURM_LOCALID only when nothing else is set";
  EXPECT_EQ(v.local_size, 4);
  EXPECT_EQ(v.local_rank_source, "PMI_LOCAL_RANK");
  env.Set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.Set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
  v = ReadLauncherVars(env.Fn());
  EXPECT_EQ(v.local_rank, 1);
  EXPECT_EQ(v.local_size, 3);
  EXPECT_EQ(v.launcher, "mpirun (Open MPI)");
}

TEST(ProcessEnvTest, SlurmLocalIdAloneHasNoSize) {
  FakeEnv env;
  env.Set("SLURM_LOCALID", "3");
  const LauncherVars v = ReadLauncherVars(env.Fn());
  EXPECT_EQ(v.local_rank, 3);
  EXPECT_FALSE(v.local_size.has_value());
  EXPECT_EQ(v.launcher, "srun");
  EXPECT_FALSE(v.slurm_gpus_on_node.has_value());
}

// What srun sets for `srun --ntasks-per-node=4 --gpus-per-task=2` on two nodes (srun(1),
// OUTPUT ENVIRONMENT VARIABLES): the step's tasks per node, compressed, and this node's index.
TEST(ProcessEnvTest, SrunLocalSizeFromTheStepsTasksPerNode) {
  FakeEnv env;
  env.Set("SLURM_LOCALID", "1");
  env.Set("SLURM_NODEID", "1");
  env.Set("SLURM_STEP_TASKS_PER_NODE", "4(x2)");
  env.Set("SLURM_TASKS_PER_NODE", "1(x2)");  // the job's, overridden by the step's
  LauncherVars v = ReadLauncherVars(env.Fn());
  EXPECT_EQ(v.local_size, 4);
  EXPECT_THAT(v.local_size_source, HasSubstr("SLURM_STEP_TASKS_PER_NODE='4(x2)'"));

  env.Set("SLURM_STEP_TASKS_PER_NODE", "2(x3),1");
  env.Set("SLURM_NODEID", "3");
  EXPECT_EQ(ReadLauncherVars(env.Fn()).local_size, 1) << "the fourth node runs one task";
  env.Set("SLURM_NODEID", "2");
  EXPECT_EQ(ReadLauncherVars(env.Fn()).local_size, 2);
}

TEST(ProcessEnvTest, SrunLocalSizeWithoutNodeId) {
  FakeEnv env;
  env.Set("SLURM_LOCALID", "0");
  env.Set("SLURM_TASKS_PER_NODE", "3(x4)");
  EXPECT_EQ(ReadLauncherVars(env.Fn()).local_size, 3) << "every node runs 3: no index needed";
  env.Set("SLURM_TASKS_PER_NODE", "3,2");
  EXPECT_FALSE(ReadLauncherVars(env.Fn()).local_size.has_value()) << "which node is unknown";
}

TEST(ProcessEnvTest, SlurmVariablesAreIgnoredUnderMpirun) {
  // mpirun inside an allocation: its ranks inherit the batch step's SLURM_* variables.
  FakeEnv env;
  env.Set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.Set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  env.Set("SLURM_LOCALID", "0");
  env.Set("SLURM_TASKS_PER_NODE", "1");
  env.Set("SLURM_GPUS_ON_NODE", "4");
  env.Set("SLURM_GPUS_PER_TASK", "2");
  const LauncherVars v = ReadLauncherVars(env.Fn());
  EXPECT_EQ(v.local_size, 4);
  EXPECT_EQ(v.local_size_source, "OMPI_COMM_WORLD_LOCAL_SIZE");
  EXPECT_FALSE(v.slurm_gpus_on_node.has_value());
  EXPECT_FALSE(v.slurm_gpus_per_task.has_value());
}

TEST(ProcessEnvTest, SrunGpuVariables) {
  FakeEnv env;
  env.Set("SLURM_LOCALID", "2");
  env.Set("SLURM_GPUS_ON_NODE", "8");
  env.Set("SLURM_STEP_GPUS", "4,5");  // narrowed per task: not read
  env.Set("SLURM_GPUS_PER_TASK", "a100:2");
  LauncherVars v = ReadLauncherVars(env.Fn());
  EXPECT_EQ(v.slurm_gpus_on_node, 8);
  EXPECT_EQ(v.slurm_gpus_per_task, 2) << "the GPU type is dropped";
  env.Set("SLURM_GPUS_PER_TASK", "a100:1,v100:2");
  EXPECT_EQ(ReadLauncherVars(env.Fn()).slurm_gpus_per_task, 3) << "types are summed";
}

TEST(ProcessEnvTest, MalformedSlurmVariablesNameTheVariable) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"SLURM_STEP_TASKS_PER_NODE", "4(x"},  {"SLURM_STEP_TASKS_PER_NODE", "x4"},
      {"SLURM_STEP_TASKS_PER_NODE", "2,,1"}, {"SLURM_TASKS_PER_NODE", "0"},
      {"SLURM_GPUS_ON_NODE", "four"},        {"SLURM_GPUS_PER_TASK", "two"},
      {"SLURM_GPUS_PER_TASK", "a100:"},      {"SLURM_NODEID", "n1"},
  };
  for (const auto& [name, value] : cases) {
    FakeEnv env;
    env.Set("SLURM_LOCALID", "0");
    env.Set("SLURM_TASKS_PER_NODE", "2");
    env.Set(name, value);
    try {
      ReadLauncherVars(env.Fn());
      ADD_FAILURE() << "no error for " << name << "='" << value << "'";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr(name + "='" + value + "'"));
    }
  }
  FakeEnv env;
  env.Set("SLURM_LOCALID", "0");
  env.Set("SLURM_NODEID", "2");
  env.Set("SLURM_STEP_TASKS_PER_NODE", "4(x2)");
  try {
    ReadLauncherVars(env.Fn());
    ADD_FAILURE() << "no error for a node beyond the list";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("SLURM_NODEID=2 but SLURM_STEP_TASKS_PER_NODE='4(x2)' lists 2 nodes"));
  }
}

TEST(ProcessEnvTest, LocalSizeMismatchNamesTheVariable) {
  LauncherVars v;
  v.local_size = 4;
  v.local_size_source = "SLURM_STEP_TASKS_PER_NODE='4'";
  try {
    CheckLauncherAgrees(v, 0, 2);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("the launcher says 4 ranks on this host but MPI counts 2 "
                                    "(SLURM_STEP_TASKS_PER_NODE='4')"));
  }
}

// ---- threads ------------------------------------------------------------------------------------

TEST(ProcessEnvTest, ThreadsFromConfigThenOmpNumThreadsThenCores) {
  EXPECT_EQ(ChooseThreads(3, "8", 16, 16, 4), 3) << "dist.threads first";
  EXPECT_EQ(ChooseThreads(0, "8", 16, 16, 4), 8);
  EXPECT_EQ(ChooseThreads(0, "6,2", 16, 16, 4), 6) << "OpenMP's nested list: the first level";
  EXPECT_EQ(ChooseThreads(0, "", 16, 16, 4), 4) << "empty counts as unset";
  EXPECT_EQ(ChooseThreads(0, nullptr, 16, 16, 4), 4) << "16 cores / 4 ranks";
  EXPECT_EQ(ChooseThreads(0, nullptr, 4, 16, 4), 4) << "pinned: the whole mask";
}

TEST(ProcessEnvTest, MalformedOmpNumThreadsIsAConfigError) {
  for (const char* bad : {"abc", "0", "-2", "4x", " 4", "8,", ",8"}) {
    SCOPED_TRACE(bad);
    try {
      ChooseThreads(0, bad, 16, 16, 4);
      ADD_FAILURE() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr("OMP_NUM_THREADS='" + std::string(bad) +
                                      "' is not a positive integer"));
    }
  }
}

TEST(ProcessEnvTest, MalformedLocalRankIsAConfigError) {
  for (const char* bad : {"", "x", "1x", " 1", "-1", "99999999999"}) {
    FakeEnv env;
    env.Set("MPI_LOCALRANKID", bad);
    try {
      ReadLauncherVars(env.Fn());
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr("MPI_LOCALRANKID='" + std::string(bad) +
                                      "' is not a non-negative integer"));
    }
  }
}

TEST(ProcessEnvTest, UnderLauncherWhenAnyWorldRankVariableIsSet) {
  FakeEnv env;
  EXPECT_FALSE(UnderLauncher(env.Fn()));
  env.Set("OMPI_COMM_WORLD_SIZE", "4");
  EXPECT_FALSE(UnderLauncher(env.Fn())) << "a size alone is not a rank";
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    FakeEnv one;
    one.Set(v, "garbage");
    EXPECT_TRUE(UnderLauncher(one.Fn())) << v << ": set is enough";
  }
}

TEST(ProcessEnvTest, WorldRankZeroByEnv) {
  FakeEnv env;
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn())) << "a single process is rank 0";
  env.Set("SLURM_PROCID", "0");
  env.Set("SLURM_NTASKS", "16");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn()));
  env.Set("PMIX_RANK", "3");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn())) << "PMIX_RANK without PMIX_SIZE: SLURM's pair";
  env.Set("PMIX_SIZE", "16");
  EXPECT_FALSE(IsWorldRankZeroByEnv(env.Fn())) << "PMIX's pair comes before SLURM's";
  env.Set("OMPI_COMM_WORLD_RANK", "0");
  env.Set("OMPI_COMM_WORLD_SIZE", "16");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn())) << "Open MPI's pair comes first";
  env.Set("OMPI_COMM_WORLD_RANK", "12");
  EXPECT_FALSE(IsWorldRankZeroByEnv(env.Fn()));
  env.Set("OMPI_COMM_WORLD_RANK", "16");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn())) << "a rank outside its world is stale";
}

TEST(ProcessEnvTest, AStaleRankExportedInAShellStillPrints) {
  // `export OMPI_COMM_WORLD_RANK=1` left in a shell, then a plain `dptrain train`: the error
  // must not vanish because this process believes another rank prints it.
  FakeEnv env;
  env.Set("OMPI_COMM_WORLD_RANK", "1");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn()));
  env.Set("SLURM_PROCID", "0");  // ... inside a Slurm allocation of 8 tasks
  env.Set("SLURM_NTASKS", "8");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn()));
  env.Set("OMPI_COMM_WORLD_SIZE", "1");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn()));
  env.Set("OMPI_COMM_WORLD_SIZE", "2");
  EXPECT_FALSE(IsWorldRankZeroByEnv(env.Fn())) << "rank 1 of 2: rank 0 prints";
  env.Set("OMPI_COMM_WORLD_RANK", "one");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn())) << "malformed: SLURM's pair, rank 0";
}

TEST(ProcessEnvTest, RankAndWorldFromTheFirstCompletePair) {
  FakeEnv env;
  EXPECT_FALSE(LauncherRankAndWorld(env.Fn()).has_value());
  env.Set("SLURM_PROCID", "5");
  EXPECT_FALSE(LauncherRankAndWorld(env.Fn()).has_value()) << "a rank without a size";
  env.Set("SLURM_NTASKS", "8");
  auto r = LauncherRankAndWorld(env.Fn());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank, 5);
  EXPECT_EQ(r->world, 8);
  env.Set("PMI_RANK", "1");
  env.Set("PMI_SIZE", "2");
  r = LauncherRankAndWorld(env.Fn());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world, 2);
  env.Set("OMPI_COMM_WORLD_RANK", "3");
  env.Set("OMPI_COMM_WORLD_SIZE", "0");
  r = LauncherRankAndWorld(env.Fn());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->world, 2) << "a size of 0 skips the pair";
  env.Set("OMPI_COMM_WORLD_SIZE", "4x");
  EXPECT_EQ(LauncherRankAndWorld(env.Fn())->world, 2) << "a malformed size skips the pair";
  env.Set("OMPI_COMM_WORLD_SIZE", "4");
  EXPECT_EQ(LauncherRankAndWorld(env.Fn())->world, 4);
  EXPECT_EQ(LauncherRankAndWorld(env.Fn())->rank, 3);
}

TEST(ProcessEnvTest, WorldSize) {
  FakeEnv env;
  EXPECT_EQ(LauncherWorldSize(env.Fn()), 1) << "alone";
  env.Set("SLURM_NTASKS", "6");
  EXPECT_EQ(LauncherWorldSize(env.Fn()), 6);
  env.Set("PMI_SIZE", "0");
  EXPECT_EQ(LauncherWorldSize(env.Fn()), 6) << "0 is not a size";
  env.Set("PMI_SIZE", "3");
  EXPECT_EQ(LauncherWorldSize(env.Fn()), 3);
  env.Set("OMPI_COMM_WORLD_SIZE", "-2");
  EXPECT_EQ(LauncherWorldSize(env.Fn()), 3) << "malformed counts as absent";
  env.Set("OMPI_COMM_WORLD_SIZE", "16");
  EXPECT_EQ(LauncherWorldSize(env.Fn()), 16);
}

TEST(ProcessEnvTest, SystemGetEnvReadsTheProcessEnvironment) {
  const GetEnvFn getenv = SystemGetEnv();
  EXPECT_EQ(getenv("DPTRAIN_PROCESS_ENV_TEST_SURELY_UNSET"), nullptr);
  EXPECT_NE(getenv("PATH"), nullptr);
}

}  // namespace
}  // namespace dptrain
