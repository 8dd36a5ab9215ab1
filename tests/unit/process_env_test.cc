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

TEST(ProcessEnvTest, SlurmLocalIdHasNoSize) {
  FakeEnv env;
  env.Set("SLURM_LOCALID", "3");
  const LauncherVars v = ReadLauncherVars(env.Fn());
  EXPECT_EQ(v.local_rank, 3);
  EXPECT_FALSE(v.local_size.has_value());
  EXPECT_EQ(v.launcher, "srun");
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
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn()));
  env.Set("PMIX_RANK", "3");
  EXPECT_FALSE(IsWorldRankZeroByEnv(env.Fn())) << "PMIX_RANK comes before SLURM_PROCID";
  env.Set("OMPI_COMM_WORLD_RANK", "0");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn())) << "Open MPI's variable comes first";
  env.Set("OMPI_COMM_WORLD_RANK", "12");
  EXPECT_FALSE(IsWorldRankZeroByEnv(env.Fn()));
  env.Set("OMPI_COMM_WORLD_RANK", "one");
  EXPECT_TRUE(IsWorldRankZeroByEnv(env.Fn())) << "malformed: print rather than stay silent";
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
