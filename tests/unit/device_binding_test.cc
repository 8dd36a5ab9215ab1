// SPDX-License-Identifier: Apache-2.0
// Device binding, the pure decision (ChooseDevice): mpirun with every GPU visible, Slurm's one
// and two GPUs per task, CUDA_VISIBLE_DEVICES with indices / GPU UUIDs / MIG ids, dist.gpus
// (alone and within CUDA_VISIBLE_DEVICES), both policies, more local ranks than GPUs (an error,
// never shared), unset vs empty vs "-1" lists, malformed entries and whitespace. The request
// from the environment and the after-binding check: device_binding_launch_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "launcher/binding_policy.h"
#include "launcher/config.h"
#include "launcher/gpu_binder.h"
#include "launcher/nvml_probe.h"
#include "tests/unit/device_binding_testing.h"

namespace dptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// ---- candidates from the environment ----------------------------------------------------------

TEST(DeviceBindingTest, MpirunWithEveryGpuVisiblePicksByLocalRank) {
  for (int r = 0; r < 4; ++r) {
    const DeviceBinding b = ChooseDevice(Request(r, 4, std::nullopt));
    EXPECT_EQ(b.entry, std::to_string(r));
    EXPECT_EQ(b.slot, r);
    ASSERT_TRUE(b.set_visible.has_value());
    EXPECT_EQ(*b.set_visible, std::to_string(r)) << "remap: exactly one GPU visible";
    EXPECT_EQ(b.cuda_ordinal, 0) << "remap: the GPU is device 0";
    EXPECT_THAT(b.source, HasSubstr("all 4 GPUs"));
  }
}

TEST(DeviceBindingTest, FewerRanksThanGpusUsesTheFirst) {
  EXPECT_EQ(ChooseDevice(Request(1, 2, std::nullopt, 8)).entry, "1");
}

TEST(DeviceBindingTest, SetDeviceKeepsEverythingVisible) {
  for (int r = 0; r < 4; ++r) {
    const DeviceBinding b =
        ChooseDevice(Request(r, 4, std::nullopt, 4, "", BindingPolicy::kSetDevice));
    EXPECT_EQ(b.entry, std::to_string(r));
    EXPECT_FALSE(b.set_visible.has_value());
    EXPECT_EQ(b.cuda_ordinal, r);
  }
}

TEST(DeviceBindingTest, SlurmOneGpuPerTaskEveryRankUsesItsOnlyGpu) {
  // srun --gpus-per-task=1: each task sees its own GPU, always as "0" or as its physical index.
  for (const std::string& visible : std::vector<std::string>{"0", "2", " 3 ", kUuidA, kMigA}) {
    for (int r = 0; r < 4; ++r) {
      SCOPED_TRACE("CUDA_VISIBLE_DEVICES=" + visible + " local rank " + std::to_string(r));
      for (BindingPolicy p : {BindingPolicy::kRemap, BindingPolicy::kSetDevice}) {
        const DeviceBinding b = ChooseDevice(Request(r, 4, visible, 4, "", p));
        EXPECT_EQ(b.slot, 0);
        EXPECT_EQ(b.entry, visible == " 3 " ? "3" : visible);
        EXPECT_EQ(b.cuda_ordinal, 0);
        EXPECT_FALSE(b.per_task) << "one entry: the one-GPU rule, no warning";
        EXPECT_TRUE(b.warning.empty());
      }
    }
  }
}

// srun --ntasks-per-node=4 --gpus-per-task=N on a node with 8 GPUs: Slurm gives task t its own N
// GPUs (--gpus-per-task implies --gpu-bind=per_task:N); SLURM_GPUS_ON_NODE counts all 4*N.
// Each rank takes the first GPU of its own list; local_size 4 is no longer "too few GPUs".
BindingRequest SrunTask(int local_rank, const std::string& own_list, int gpus_per_task,
                        BindingPolicy policy = BindingPolicy::kRemap) {
  BindingRequest r = Request(local_rank, 4, own_list, 8, "", policy);
  r.slurm_gpus_on_node = 4 * gpus_per_task;
  r.slurm_gpus_per_task = gpus_per_task;
  return r;
}

TEST(DeviceBindingTest, SlurmTwoGpusPerTaskEachRankTakesTheFirstOfItsOwn) {
  const std::vector<std::string> lists = {"0,1", "2,3", "4,5", "6,7"};
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("local rank " + std::to_string(r));
    const DeviceBinding b = ChooseDevice(SrunTask(r, lists[static_cast<size_t>(r)], 2));
    EXPECT_TRUE(b.per_task);
    EXPECT_EQ(b.slot, 0);
    EXPECT_EQ(b.entry, std::to_string(2 * r));
    EXPECT_EQ(*b.set_visible, std::to_string(2 * r));
    EXPECT_THAT(b.source, HasSubstr("this task's own CUDA_VISIBLE_DEVICES"));
    EXPECT_THAT(b.warning,
                AllOf(HasSubstr("2 GPUs"), HasSubstr("uses the first"),
                      HasSubstr("1 GPU per task stay idle"), HasSubstr("--gpus-per-task=1")));
    const DeviceBinding s =
        ChooseDevice(SrunTask(r, lists[static_cast<size_t>(r)], 2, BindingPolicy::kSetDevice));
    EXPECT_EQ(s.cuda_ordinal, 0) << "set-device: the first of the task's list is CUDA device 0";
  }
  // Under cgroup device isolation every task's list may read "0,1": still its own.
  EXPECT_EQ(ChooseDevice(SrunTask(3, "0,1", 2)).entry, "0");
}

TEST(DeviceBindingTest, SlurmOneGpuPerTaskWithGpusOnNodeKnown) {
  for (int r = 0; r < 4; ++r) {
    const DeviceBinding b = ChooseDevice(SrunTask(r, std::to_string(r), 1));
    EXPECT_EQ(b.entry, std::to_string(r));
    EXPECT_TRUE(b.warning.empty()) << "nothing idle";
  }
}

TEST(DeviceBindingTest, SlurmPerTaskListWithoutGpusOnNodeFallsBackOnGpusPerTask) {
  BindingRequest r = SrunTask(1, "2,3", 2);
  r.slurm_gpus_on_node.reset();
  EXPECT_TRUE(ChooseDevice(r).per_task);
  EXPECT_EQ(ChooseDevice(r).entry, "2");
  r.slurm_gpus_per_task.reset();
  EXPECT_THAT(ErrorOf([&] { ChooseDevice(r); }), HasSubstr("only 2 GPUs are available"))
      << "nothing says the list is the task's own";
}

TEST(DeviceBindingTest, SlurmGpuBindNoneKeepsTheStepsListAndPicksByLocalRank) {
  // --gpus-per-task=2 --gpu-bind=none: every task sees the step's 8 GPUs.
  const DeviceBinding b = ChooseDevice(SrunTask(3, "0,1,2,3,4,5,6,7", 2));
  EXPECT_FALSE(b.per_task);
  EXPECT_EQ(b.entry, "3");
  EXPECT_TRUE(b.warning.empty());
}

TEST(DeviceBindingTest, SlurmTooFewGpusPerNodeIsStillAnError) {
  // srun --ntasks-per-node=4 --gpus-per-node=2: the list is the whole step's, not a task's.
  BindingRequest r = Request(3, 4, "0,1", 8);
  r.slurm_gpus_on_node = 2;
  EXPECT_THAT(ErrorOf([&] { ChooseDevice(r); }), HasSubstr("only 2 GPUs are available"));
}

TEST(DeviceBindingTest, DistGpusOverridesThePerTaskRule) {
  BindingRequest r = SrunTask(1, "2,3", 2);
  r.gpus = "1";
  const DeviceBinding b = ChooseDevice(r);
  EXPECT_FALSE(b.per_task);
  EXPECT_EQ(b.entry, "3") << "dist.gpus indexes the task's own list";
}

TEST(DeviceBindingTest, VisibleIndicesAreTheCandidates) {
  // --gpus-per-node=4 on a node with 8: Slurm sets 4,5,6,7 for every task.
  const DeviceBinding b = ChooseDevice(Request(2, 4, "4,5,6,7", 8));
  EXPECT_EQ(b.entry, "6");
  EXPECT_EQ(*b.set_visible, "6");
  EXPECT_THAT(b.source, HasSubstr("CUDA_VISIBLE_DEVICES='4,5,6,7'"));
  const DeviceBinding s = ChooseDevice(Request(2, 4, "4,5,6,7", 8, "", BindingPolicy::kSetDevice));
  EXPECT_EQ(s.entry, "6");
  EXPECT_EQ(s.cuda_ordinal, 2) << "the CUDA ordinal is the position in the visible list";
  EXPECT_FALSE(s.set_visible.has_value());
}

TEST(DeviceBindingTest, GpuUuidsInVisibleDevices) {
  const std::string visible = kUuidA + "," + kUuidB + "," + kUuidC;
  const DeviceBinding b = ChooseDevice(Request(1, 3, visible, std::nullopt));
  EXPECT_EQ(b.entry, kUuidB);
  EXPECT_EQ(*b.set_visible, kUuidB);
  const DeviceBinding s =
      ChooseDevice(Request(2, 3, visible, std::nullopt, "", BindingPolicy::kSetDevice));
  EXPECT_EQ(s.entry, kUuidC);
  EXPECT_EQ(s.cuda_ordinal, 2);
}

TEST(DeviceBindingTest, UuidPrefixesAreAccepted) {
  // CUDA accepts any unique prefix of a UUID.
  EXPECT_EQ(ChooseDevice(Request(1, 2, "GPU-8f6c,GPU-0b1d", std::nullopt)).entry, "GPU-0b1d");
}

TEST(DeviceBindingTest, MigIds) {
  const DeviceBinding b = ChooseDevice(Request(1, 2, kMigA + "," + kMigB, 1));
  EXPECT_EQ(b.entry, kMigB);
  EXPECT_EQ(*b.set_visible, kMigB);
  // The pre-CUDA-11.4 form MIG-GPU-<uuid>/<gpu instance>/<compute instance>.
  const std::string legacy = "MIG-" + kUuidA + "/1/0," + "MIG-" + kUuidA + "/2/0";
  EXPECT_EQ(ChooseDevice(Request(0, 2, legacy, 1)).entry, "MIG-" + kUuidA + "/1/0");
}

TEST(DeviceBindingTest, WhitespaceAroundEntriesIsIgnored) {
  const DeviceBinding b = ChooseDevice(Request(1, 2, " 0 ,\t1 ", 4));
  EXPECT_EQ(b.entry, "1");
  EXPECT_EQ(b.candidates, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(ChooseDevice(Request(1, 2, std::nullopt, 4, " 2 , 3 ")).entry, "3");
}

// ---- dist.gpus ----------------------------------------------------------------------------------

TEST(DeviceBindingTest, GpusFlagSelectsPhysicalGpus) {
  // The familiar device_ids=[2,3]: two ranks on GPUs 2 and 3 of a 4-GPU host.
  const DeviceBinding b0 = ChooseDevice(Request(0, 2, std::nullopt, 4, "2,3"));
  const DeviceBinding b1 = ChooseDevice(Request(1, 2, std::nullopt, 4, "2,3"));
  EXPECT_EQ(b0.entry, "2");
  EXPECT_EQ(b1.entry, "3");
  EXPECT_EQ(*b1.set_visible, "3");
  EXPECT_THAT(b1.source, HasSubstr("dist.gpus='2,3'"));
  const DeviceBinding s =
      ChooseDevice(Request(1, 2, std::nullopt, 4, "2,3", BindingPolicy::kSetDevice));
  EXPECT_EQ(s.cuda_ordinal, 3);
}

TEST(DeviceBindingTest, GpusIndicesArePositionsInVisibleDevices) {
  const DeviceBinding b = ChooseDevice(Request(1, 2, "4,5,6,7", 8, "1,3"));
  EXPECT_EQ(b.entry, "7");
  EXPECT_EQ(b.candidates, (std::vector<std::string>{"5", "7"}));
  const DeviceBinding s =
      ChooseDevice(Request(0, 2, "4,5,6,7", 8, "1,3", BindingPolicy::kSetDevice));
  EXPECT_EQ(s.entry, "5");
  EXPECT_EQ(s.cuda_ordinal, 1);
}

TEST(DeviceBindingTest, GpusUuidMustBeInVisibleDevices) {
  const std::string visible = kUuidA + "," + kUuidB;
  const DeviceBinding b =
      ChooseDevice(Request(0, 1, visible, std::nullopt, kUuidB, BindingPolicy::kSetDevice));
  EXPECT_EQ(b.entry, kUuidB);
  EXPECT_EQ(b.cuda_ordinal, 1);
  EXPECT_THAT(ErrorOf([&] { ChooseDevice(Request(0, 1, visible, std::nullopt, kUuidC)); }),
              AllOf(HasSubstr(kUuidC), HasSubstr("is not one of CUDA_VISIBLE_DEVICES")));
}

TEST(DeviceBindingTest, GpusIndexOutOfVisibleRange) {
  EXPECT_THAT(
      ErrorOf([] { ChooseDevice(Request(0, 1, "4,5", 8, "2")); }),
      AllOf(HasSubstr("dist.gpus='2'"), HasSubstr("out of range"), HasSubstr("2 GPUs visible")));
}

TEST(DeviceBindingTest, GpusUuidWithoutVisibleDevices) {
  BindingRequest r = Request(0, 1, std::nullopt, 3, kUuidB, BindingPolicy::kSetDevice);
  r.device_uuids = {kUuidA, kUuidB, kUuidC};
  EXPECT_EQ(ChooseDevice(r).cuda_ordinal, 1) << "NVML index of the UUID";
  r.device_uuids.clear();
  EXPECT_THAT(ErrorOf([&] { ChooseDevice(r); }), HasSubstr("set-device cannot find"));
  r.policy = BindingPolicy::kRemap;
  const DeviceBinding b = ChooseDevice(r);
  EXPECT_EQ(*b.set_visible, kUuidB) << "remap needs no ordinal";
}

// ---- more local ranks than GPUs -----------------------------------------------------------------

TEST(DeviceBindingTest, MoreLocalRanksThanGpusIsAnError) {
  const std::string msg = ErrorOf([] { ChooseDevice(Request(0, 4, std::nullopt, 2)); });
  EXPECT_THAT(
      msg, AllOf(HasSubstr("4 ranks"), HasSubstr("only 2 GPUs"), HasSubstr("--ntasks-per-node=2"),
                 HasSubstr("dist.device=cpu"), Not(HasSubstr("DPTRAIN_ALLOW_GPU_SHARING"))))
      << "the hint must not offer sharing: NCCL refuses two ranks on one GPU";
  // Every rank fails alike, also those that would have a GPU.
  EXPECT_THROW(ChooseDevice(Request(1, 4, "0,1", 2)), ConfigError);
  EXPECT_THROW(ChooseDevice(Request(0, 3, std::nullopt, 4, "1,2")), ConfigError);
}

TEST(DeviceBindingTest, GpuSharingIsRefusedEvenWhenAllowedBecauseNcclRejectsIt) {
  for (int r = 0; r < 4; ++r) {
    BindingRequest q = Request(r, 4, std::nullopt, 2);
    q.allow_sharing = true;
    EXPECT_THAT(
        ErrorOf([&] { ChooseDevice(q); }),
        AllOf(HasSubstr("only 2 GPUs"), HasSubstr("DPTRAIN_ALLOW_GPU_SHARING=1 cannot help"),
              HasSubstr("Duplicate GPU detected"), HasSubstr("host memory only")));
  }
}

TEST(DeviceBindingTest, UnknownLocalSizeChecksTheRankItself) {
  EXPECT_EQ(ChooseDevice(Request(3, 0, std::nullopt, 4)).entry, "3");
  EXPECT_THAT(ErrorOf([] { ChooseDevice(Request(5, 0, std::nullopt, 4)); }),
              HasSubstr("local rank 5 needs a GPU"));
}

// ---- empty, hidden, malformed -------------------------------------------------------------------

TEST(DeviceBindingTest, EmptyVisibleDevicesHidesEveryGpu) {
  for (const std::string v : {"", "  ", "-1", "-1,0"}) {
    SCOPED_TRACE("CUDA_VISIBLE_DEVICES='" + v + "'");
    EXPECT_TRUE(VisibleDevicesHideAll(v));
    EXPECT_THAT(ErrorOf([&] { ChooseDevice(Request(0, 1, v)); }),
                AllOf(HasSubstr("hides every GPU"), HasSubstr("dist.device=cpu")));
  }
  EXPECT_FALSE(VisibleDevicesHideAll(std::nullopt)) << "unset is not empty";
  EXPECT_FALSE(VisibleDevicesHideAll("0"));
}

TEST(DeviceBindingTest, MalformedListsNameTheEntry) {
  struct Case {
    std::string visible, want;
  };
  for (const Case& c : std::vector<Case>{{"0,,1", "empty entry"},
                                         {"0,", "empty entry"},
                                         {",0", "empty entry"},
                                         {"0,abc", "'abc'"},
                                         {"1.5", "'1.5'"},
                                         {"GPU-", "'GPU-'"},
                                         {"GPU-xyz", "'GPU-xyz'"},
                                         {"MIG-", "'MIG-'"},
                                         {"0,0", "'0' is listed twice"},
                                         {"0,-1", "'-1' is not a device"},
                                         {"gpu0", "'gpu0'"}}) {
    SCOPED_TRACE("CUDA_VISIBLE_DEVICES='" + c.visible + "'");
    EXPECT_THAT(ErrorOf([&] { ChooseDevice(Request(0, 1, c.visible)); }),
                AllOf(HasSubstr("CUDA_VISIBLE_DEVICES='" + c.visible + "'"), HasSubstr(c.want)));
  }
  for (const std::string g : {"", "2,", "2,x", "3,3", "-1"}) {
    if (g.empty()) continue;  // empty dist.gpus means "not given"
    SCOPED_TRACE("dist.gpus='" + g + "'");
    EXPECT_THAT(ErrorOf([&] { ChooseDevice(Request(0, 1, std::nullopt, 4, g)); }),
                HasSubstr("dist.gpus='" + g + "'"));
  }
}

TEST(DeviceBindingTest, IndexBeyondTheGpuCount) {
  EXPECT_THAT(ErrorOf([] { ChooseDevice(Request(0, 1, "7", 4)); }),
              AllOf(HasSubstr("GPU 7 does not exist"), HasSubstr("4 GPUs (0-3)")));
  EXPECT_THAT(ErrorOf([] { ChooseDevice(Request(0, 1, std::nullopt, 4, "4")); }),
              HasSubstr("GPU 4 does not exist"));
  // Without NVML the count is unknown: indices cannot be checked here (CUDA will).
  EXPECT_EQ(ChooseDevice(Request(0, 1, "7", std::nullopt)).entry, "7");
}

TEST(DeviceBindingTest, NoCountAndNothingVisible) {
  BindingRequest r = Request(0, 1, std::nullopt, std::nullopt);
  r.device_count_why = "no NVIDIA driver (libnvidia-ml.so.1: cannot open shared object file)";
  EXPECT_THAT(ErrorOf([&] { ChooseDevice(r); }),
              AllOf(HasSubstr("cannot count"), HasSubstr("no NVIDIA driver")));
  EXPECT_THAT(ErrorOf([] { ChooseDevice(Request(0, 1, std::nullopt, 0)); }),
              HasSubstr("no GPU found"));
}

TEST(DeviceBindingTest, DescribeNamesTheChoice) {
  const DeviceBinding b = ChooseDevice(Request(1, 2, "4,5", 8));
  EXPECT_THAT(b.Describe(), AllOf(HasSubstr("5"), HasSubstr("CUDA_VISIBLE_DEVICES=5")));
  const DeviceBinding s = ChooseDevice(Request(1, 2, "4,5", 8, "", BindingPolicy::kSetDevice));
  EXPECT_THAT(s.Describe(), HasSubstr("cudaSetDevice(1)"));
}

TEST(DeviceBindingTest, ParsePolicy) {
  EXPECT_EQ(ParseBindingPolicy("remap"), BindingPolicy::kRemap);
  EXPECT_EQ(ParseBindingPolicy("set-device"), BindingPolicy::kSetDevice);
  EXPECT_THAT(ErrorOf([] { ParseBindingPolicy("setdevice"); }), HasSubstr("dist.device_binding"));
}

}  // namespace
}  // namespace dptrain
