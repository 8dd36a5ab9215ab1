// SPDX-License-Identifier: Apache-2.0
// Device binding, the pure decision: mpirun with every GPU visible, Slurm's one GPU per task,
// CUDA_VISIBLE_DEVICES with indices / GPU UUIDs / MIG ids, dist.gpus (alone and within
// CUDA_VISIBLE_DEVICES), both policies, more local ranks than GPUs (error, or shared when
// allowed), unset vs empty vs "-1" lists, malformed entries and whitespace; then the
// after-binding uniqueness check and the table rank 0 prints.
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

namespace dptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kUuidA = "GPU-8f6c1a2e-1111-2222-3333-444455556666";
const std::string kUuidB = "GPU-0b1d2c3e-aaaa-bbbb-cccc-ddddeeeeffff";
const std::string kUuidC = "GPU-77aa88bb-0000-1111-2222-333344445555";
const std::string kMigA = "MIG-4f2b7c1d-1234-5678-9abc-def012345678";
const std::string kMigB = "MIG-9e8d7c6b-1234-5678-9abc-def012345678";

BindingRequest Request(int local_rank, int local_size, std::optional<std::string> visible,
                       std::optional<int> count = 4, std::string gpus = "",
                       BindingPolicy policy = BindingPolicy::kRemap) {
  BindingRequest r;
  r.local_rank = local_rank;
  r.local_size = local_size;
  r.cuda_visible_devices = std::move(visible);
  r.device_count = count;
  r.gpus = std::move(gpus);
  r.policy = policy;
  return r;
}

// The message of the ConfigError that `fn` throws ("" and a test failure when it throws none).
template <class F>
std::string ErrorOf(F&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

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
    EXPECT_FALSE(b.shared);
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
        EXPECT_FALSE(b.shared) << "one visible device is not sharing by itself";
      }
    }
  }
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
  EXPECT_THAT(msg, AllOf(HasSubstr("4 ranks"), HasSubstr("only 2 GPUs"),
                         HasSubstr("DPTRAIN_ALLOW_GPU_SHARING")));
  // Every rank fails alike, also those that would have a GPU.
  EXPECT_THROW(ChooseDevice(Request(1, 4, "0,1", 2)), ConfigError);
  EXPECT_THROW(ChooseDevice(Request(0, 3, std::nullopt, 4, "1,2")), ConfigError);
}

TEST(DeviceBindingTest, MoreLocalRanksThanGpusSharedWhenAllowed) {
  for (int r = 0; r < 4; ++r) {
    BindingRequest q = Request(r, 4, std::nullopt, 2);
    q.allow_sharing = true;
    const DeviceBinding b = ChooseDevice(q);
    EXPECT_EQ(b.entry, std::to_string(r % 2));
    EXPECT_TRUE(b.shared);
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
  EXPECT_NO_THROW(ExchangeBindings(c0, rows[0], /*allow_sharing=*/true));
}

}  // namespace
}  // namespace dptrain
