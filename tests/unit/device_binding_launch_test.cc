// SPDX-License-Identifier: Apache-2.0
// Device binding as launchers set it up: the request built from the environment (Slurm's
// per-task GPU lists under srun --gpus-per-task=1 and =2, read through launcher/process_env.h),
// what `dptrain info` describes, the device kind "auto" resolves to, and the after-binding
// uniqueness check with the table rank 0 prints.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
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

// ---- from the environment -----------------------------------------------------------------------

TEST(DeviceBindingTest, RequestFromEnvironment) {
  std::map<std::string, std::string> env;
  GetEnvFn getenv = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  DistConfig dist;
  dist.gpus = " 2,3 ";
  dist.device_binding = BindingPolicy::kSetDevice;
  GpuInventory inv;
  inv.available = true;
  inv.gpus.resize(4);
  inv.gpus[1].uuid = kUuidB;
  BindingRequest r = MakeBindingRequest(dist, 1, 2, inv, getenv);
  EXPECT_FALSE(r.cuda_visible_devices.has_value()) << "unset stays unset";
  EXPECT_EQ(r.gpus, "2,3");
  EXPECT_EQ(r.policy, BindingPolicy::kSetDevice);
  EXPECT_EQ(r.device_count, 4);
  EXPECT_EQ(r.device_uuids[1], kUuidB);
  EXPECT_FALSE(r.allow_sharing);

  env["CUDA_VISIBLE_DEVICES"] = "";
  env["DPTRAIN_ALLOW_GPU_SHARING"] = "1";
  r = MakeBindingRequest(dist, 0, 2, GpuInventory{}, getenv);
  ASSERT_TRUE(r.cuda_visible_devices.has_value()) << "set but empty is not unset";
  EXPECT_EQ(*r.cuda_visible_devices, "");
  EXPECT_TRUE(r.allow_sharing);
  EXPECT_FALSE(r.device_count.has_value());
  env["DPTRAIN_ALLOW_GPU_SHARING"] = "no";
  EXPECT_FALSE(AllowGpuSharing(getenv));
}

// The environment of local rank 1 under `srun --ntasks-per-node=4 --gpus-per-task=2` (8 GPUs), as
// Slurm sets it (SLURM_STEP_GPUS is narrowed per task like CUDA_VISIBLE_DEVICES).
std::map<std::string, std::string> SrunTwoGpusPerTaskEnv() {
  return {{"SLURM_LOCALID", "1"},       {"SLURM_PROCID", "1"},
          {"SLURM_NODEID", "0"},        {"SLURM_STEP_TASKS_PER_NODE", "4"},
          {"SLURM_GPUS_ON_NODE", "8"},  {"SLURM_STEP_GPUS", "2,3"},
          {"SLURM_GPUS_PER_TASK", "2"}, {"CUDA_VISIBLE_DEVICES", "2,3"}};
}

GpuInventory EightGpus() {
  GpuInventory inv;
  inv.available = true;
  inv.gpus.resize(8);
  return inv;
}

TEST(DeviceBindingTest, SrunRequestCarriesTheGpusOnNode) {
  auto env = SrunTwoGpusPerTaskEnv();
  GetEnvFn getenv = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  const LauncherVars vars = ReadLauncherVars(getenv);
  ASSERT_EQ(vars.local_size, 4) << "dptrain info must know the local size under srun";
  const BindingRequest r =
      MakeBindingRequest(DistConfig{}, 1, *vars.local_size, EightGpus(), getenv);
  EXPECT_EQ(r.slurm_gpus_on_node, 8);
  EXPECT_EQ(r.slurm_gpus_per_task, 2);
  const DeviceBinding b = ChooseDevice(r);
  EXPECT_EQ(b.entry, "2");
  EXPECT_FALSE(b.warning.empty());

  // Under mpirun the same inherited SLURM_* variables say nothing about the ranks' lists.
  env["OMPI_COMM_WORLD_LOCAL_RANK"] = "1";
  env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  const BindingRequest m = MakeBindingRequest(DistConfig{}, 1, 2, EightGpus(), getenv);
  EXPECT_FALSE(m.slurm_gpus_on_node.has_value());
  EXPECT_EQ(ChooseDevice(m).entry, "3") << "mpirun: local rank 1 takes entry 1";
}

TEST(DeviceBindingTest, InfoUnderSrunDescribesOnlyThisTasksRank) {
  auto env = SrunTwoGpusPerTaskEnv();
  GetEnvFn getenv = [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  const std::string d = DescribeBindings(DistConfig{}, EightGpus(), getenv, 4, 1);
  EXPECT_THAT(d, AllOf(HasSubstr("local rank 1 of 4: 2 (candidate 0 of this task's own "
                                 "CUDA_VISIBLE_DEVICES='2,3' (srun --gpus-per-task=2))"),
                       HasSubstr("warning: srun gave each task 2 GPUs"),
                       Not(HasSubstr("local rank 0 of 4")), Not(HasSubstr("error"))));
  // --gpus-per-node=4 style (every task sees the step's list): every local rank is described.
  env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3,4,5,6,7";
  const std::string all = DescribeBindings(DistConfig{}, EightGpus(), getenv, 4, 1);
  EXPECT_THAT(all, AllOf(HasSubstr("local rank 0 of 4: 0"), HasSubstr("local rank 3 of 4: 3"),
                         Not(HasSubstr("warning"))));
}

TEST(DeviceBindingTest, ResolveDeviceKind) {
  GpuInventory none;
  none.why = "no NVIDIA driver";
  GpuInventory two;
  two.available = true;
  two.gpus.resize(2);
  EXPECT_EQ(ResolveDeviceKind("cpu", true, two, std::nullopt), "cpu");
  EXPECT_EQ(ResolveDeviceKind("cuda", true, none, std::nullopt), "cuda") << "errors come later";
  EXPECT_EQ(ResolveDeviceKind("auto", true, two, std::nullopt), "cuda");
  EXPECT_EQ(ResolveDeviceKind("auto", false, two, std::nullopt), "cpu") << "not built";
  EXPECT_EQ(ResolveDeviceKind("auto", true, none, std::nullopt), "cpu") << "no driver";
  EXPECT_EQ(ResolveDeviceKind("auto", true, two, ""), "cpu") << "all hidden";
  EXPECT_EQ(ResolveDeviceKind("auto", true, two, "-1"), "cpu");
  EXPECT_EQ(ResolveDeviceKind("auto", true, two, "1"), "cuda");
}

TEST(DeviceBindingTest, ProbeGpusNeverThrows) {
  const GpuInventory inv = ProbeGpus();
  if (!inv.available) {
    EXPECT_FALSE(inv.why.empty()) << "an unavailable NVML says why";
    EXPECT_TRUE(inv.gpus.empty());
  } else {
    for (size_t i = 0; i < inv.gpus.size(); ++i) EXPECT_EQ(inv.gpus[i].index, static_cast<int>(i));
  }
}

// ---- after binding ------------------------------------------------------------------------------

std::vector<BoundDevice> Rows() {
  return {
      {0, "node-a", 0, "0", "NVIDIA H100", kUuidA, "00000000:1B:00.0"},
      {1, "node-a", 1, "1", "NVIDIA H100", kUuidB, "00000000:43:00.0"},
      {2, "node-b", 0, "0", "NVIDIA H100", kUuidC, "00000000:1B:00.0"},
  };
}

TEST(DeviceBindingTest, DistinctGpusPass) { EXPECT_EQ(FindSharedGpu(Rows()), ""); }

TEST(DeviceBindingTest, TwoRanksOnOneGpuNamesBoth) {
  std::vector<BoundDevice> rows = Rows();
  rows.push_back({3, "node-b", 1, "0", "NVIDIA H100", kUuidC, "00000000:1B:00.0"});
  EXPECT_THAT(FindSharedGpu(rows), AllOf(HasSubstr("ranks 2 and 3"), HasSubstr(kUuidC),
                                         HasSubstr("node-b"), HasSubstr("local ranks 0 and 1")));
}

// Two MIG instances of one GPU share its PCI bus id but have their own MIG UUIDs (the CUDA
// backend names a MIG instance by cuDeviceGetUuid_v2): two CUDA devices, but NCCL identifies a
// GPU by host and bus id and refuses them ("Duplicate GPU detected"; issue 63): the binding check
// says so before NCCL starts. Instances of two GPUs, or on two hosts, pass.
TEST(DeviceBindingTest, TwoMigInstancesOfOneGpuAreRefusedBeforeNccl) {
  const char* mig_a = "MIG-9b2f33a8-4d53-5c7e-a1f2-0c4b1e2d3f40";
  const char* mig_b = "MIG-5e61c2d0-7a8b-5f19-b3c4-d5e6f7a8b9c0";
  std::vector<BoundDevice> rows = {
      {0, "node-a", 0, mig_a, "NVIDIA A100 MIG 3g.40gb", mig_a, "00000000:1B:00.0"},
      {1, "node-a", 1, mig_b, "NVIDIA A100 MIG 3g.40gb", mig_b, "00000000:1B:00.0"},
  };
  EXPECT_THAT(
      FindSharedGpu(rows),
      AllOf(HasSubstr("ranks 0 and 1 use two MIG instances of one GPU"), HasSubstr(mig_a),
            HasSubstr(mig_b), HasSubstr("00000000:1B:00.0"), HasSubstr("Duplicate GPU detected")));
  rows[1].pci_bus_id = "00000000:43:00.0";  // an instance of another GPU
  EXPECT_EQ(FindSharedGpu(rows), "");
  rows[1].pci_bus_id = rows[0].pci_bus_id;
  rows[1].host = "node-b";  // the same bus id on another host
  EXPECT_EQ(FindSharedGpu(rows), "");
  rows[1].host = "node-a";
  rows[1].uuid = mig_a;  // the same instance twice is the plain shared-GPU error
  EXPECT_THAT(FindSharedGpu(rows),
              AllOf(HasSubstr("ranks 0 and 1 are on the same GPU"), HasSubstr(mig_a)));
}

TEST(DeviceBindingTest, WithoutUuidsTheBusIdPerHostDecides) {
  std::vector<BoundDevice> rows = Rows();
  for (auto& r : rows) r.uuid.clear();
  EXPECT_EQ(FindSharedGpu(rows), "") << "the same bus id on two hosts is two GPUs";
  rows[1].pci_bus_id = rows[0].pci_bus_id;
  EXPECT_THAT(FindSharedGpu(rows), HasSubstr("ranks 0 and 1"));
}

TEST(DeviceBindingTest, BindingTableListsEveryRank) {
  const std::string t = FormatBindingTable(Rows());
  EXPECT_THAT(t, AllOf(HasSubstr("node-a"), HasSubstr("node-b"), HasSubstr(kUuidB),
                       HasSubstr("00000000:43:00.0")));
}

// A control plane whose AllGatherStrings returns preset rows (the other ranks' contributions).
class FakeComm final : public ControlPlane {
 public:
  FakeComm(int rank, std::vector<std::string> others) : rank_(rank), others_(std::move(others)) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(others_.size()); }
  void AllReduceHost(double*, int, ReduceOp) override {}
  void AllReduceHost(int64_t*, int, ReduceOp) override {}
  void BroadcastHost(void*, size_t, int) override {}
  std::vector<std::string> AllGatherStrings(const std::string& mine) override {
    std::vector<std::string> out = others_;
    out[static_cast<size_t>(rank_)] = mine;
    return out;
  }
  void GatherHost(const double*, int, double*, int) override {}
  void Barrier() override {}

 private:
  int rank_;
  std::vector<std::string> others_;
};

std::string Row(const BoundDevice& d) {
  return std::to_string(d.rank) + "\t" + d.host + "\t" + std::to_string(d.local_rank) + "\t" +
         d.entry + "\t" + d.name + "\t" + d.uuid + "\t" + d.pci_bus_id;
}

TEST(DeviceBindingTest, ExchangeAgreesOnEveryRank) {
  const std::vector<BoundDevice> rows = Rows();
  std::vector<std::string> strs;
  for (const auto& r : rows) strs.push_back(Row(r));
  FakeComm r0(0, strs), r1(1, strs);
  EXPECT_THAT(ExchangeBindings(r0, rows[0], false), HasSubstr(kUuidC));
  EXPECT_EQ(ExchangeBindings(r1, rows[1], false), "") << "only rank 0 gets the table";

  // Rank 1 lands on rank 0's GPU: both ranks throw the same error.
  BoundDevice clash = rows[1];
  clash.uuid = kUuidA;
  strs[1] = Row(clash);
  FakeComm c0(0, strs), c1(1, strs);
  const std::string e0 = ErrorOf([&] { ExchangeBindings(c0, rows[0], false); });
  const std::string e1 = ErrorOf([&] { ExchangeBindings(c1, clash, false); });
  EXPECT_THAT(e0, HasSubstr("ranks 0 and 1"));
  EXPECT_THAT(e1, HasSubstr("ranks 0 and 1"));
  // DPTRAIN_ALLOW_GPU_SHARING no longer lets them through: NCCL would reject the pair.
  EXPECT_THAT(ErrorOf([&] { ExchangeBindings(c0, rows[0], /*sharing_requested=*/true); }),
              AllOf(HasSubstr("ranks 0 and 1"), HasSubstr("Duplicate GPU detected")));
  EXPECT_THAT(e0, Not(HasSubstr("DPTRAIN_ALLOW_GPU_SHARING")));
  // The test hook (TrainHooks::share_gpu) lets them through, and the table says so.
  EXPECT_THAT(ExchangeBindings(c0, rows[0], false, /*tests_share=*/true),
              AllOf(HasSubstr(kUuidA), HasSubstr("test hook: ranks share a GPU"),
                    HasSubstr("ranks 0 and 1")));
  EXPECT_EQ(ExchangeBindings(c1, clash, false, /*tests_share=*/true), "");
  // Without a shared GPU the hook changes nothing.
  FakeComm d0(0, {Row(rows[0]), Row(rows[1])});
  EXPECT_THAT(ExchangeBindings(d0, rows[0], false, true), Not(HasSubstr("test hook")));
}

TEST(DeviceBindingTest, SharedGpuMakesEveryRankAHostOfItsOwnToNccl) {
  // NCCL's duplicate-GPU check compares the host hash (NCCL_HOSTID when set) and the bus id:
  // a host id per rank, with the socket transport on loopback as the only one left.
  const std::string set0 = ShareGpuOverNcclSockets(0);
  const std::string id0 = std::getenv("NCCL_HOSTID");
  const std::string set1 = ShareGpuOverNcclSockets(1);
  const std::string id1 = std::getenv("NCCL_HOSTID");
  EXPECT_NE(id0, id1);
  EXPECT_THAT(set1, HasSubstr("NCCL_HOSTID=" + id1));
  for (const char* v : {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE"}) {
    ASSERT_NE(std::getenv(v), nullptr) << v;
    EXPECT_STREQ(std::getenv(v), "1") << v;
    EXPECT_THAT(set0, HasSubstr(std::string(v) + "=1"));
  }
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "lo");
  for (const char* v : {"NCCL_HOSTID", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE",
                        "NCCL_NVLS_ENABLE", "NCCL_SOCKET_IFNAME"}) {
    unsetenv(v);
  }
}

}  // namespace
}  // namespace dptrain
