// SPDX-License-Identifier: Apache-2.0
// dptrain entry point: subcommands train, convert, inspect, info. The only place that decides a
// process's fate: errors are printed once and turned into the exit codes of DESIGN.md section 8
// (MPI_Abort when only some ranks failed, so no peer is left blocked in a collective).
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "datasets/convert/convert.h"
#include "datasets/inspect.h"
#include "launcher/config.h"
#include "launcher/process_env.h"
#include "runtime/backend_registry.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/error.h"
#include "runtime/trainer.h"

namespace dptrain {
namespace {

// Before MPI_Init we only know our rank from the launcher's variables; print pre-MPI errors
// (bad command line, bad config: identical on every rank) once, from world rank 0.
bool IsWorldRankZeroByEnv() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s) == 0;
  }
  return true;
}

void PrintError(const std::string& what) {
  std::fprintf(stderr, "dptrain: error: %s\n", what.c_str());
  std::fflush(stderr);
}

int CmdTrain(const std::string& config_path, const std::vector<std::string>& sets, int* argc,
             char*** argv) {
  // Launcher variables are read before MPI_Init (and before anything touches a GPU).
  const LauncherVars vars = ReadLauncherVars([](const char* n) { return std::getenv(n); });
  TrainConfig cfg;
  try {
    cfg = LoadConfig(config_path, sets);
  } catch (const Error& e) {
    if (IsWorldRankZeroByEnv()) PrintError(e.what());
    return e.exit_code();
  }

  MpiSession mpi(argc, argv);
  std::unique_ptr<Communicator> comm;
  try {
    comm = mpi.World();
    ProcessEnv env;
    env.rank = comm->rank();
    env.world = comm->size();
    env.host = HostName();
    env.vars = vars;
    mpi.LocalRankAndSize(&env.local_rank, &env.local_size);
    SetProcessContext({env.rank, env.world, env.host});

    RunAgreed(*comm, [&] { CheckLauncherAgrees(vars, env.local_rank, env.local_size); });
    // Every rank must run the same configuration.
    int64_t h[2] = {static_cast<int64_t>(ConfigHash(cfg) >> 1),
                    -static_cast<int64_t>(ConfigHash(cfg) >> 1)};
    comm->AllReduceHost(h, 2, ReduceOp::kMax);
    RunAgreed(*comm, [&] {
      DPT_CHECK_AS(ConfigError, h[0] == -h[1])
          << "the ranks resolved different configurations (a different --set or config file "
          << "on some ranks, or files that differ between hosts); every rank must run the same";
    });

    const int threads = ChooseThreads(cfg.dist.threads, std::getenv("OMP_NUM_THREADS"),
                                      AffinityCores(), env.local_size);
    std::string device = cfg.dist.device;
    Backend* backend = nullptr;
    RunAgreed(*comm, [&] {
      if (device == "auto") {
        std::string why;
        device = BackendAvailable("cuda", &why) ? "cuda" : "cpu";
      }
      backend = &GetBackend(device);
      backend->SetThreads(threads);
      if (cfg.memory.limit_bytes > 0) backend->allocator().set_budget(cfg.memory.limit_bytes);
    });
    const std::string table = RankTable(*comm, env, device, threads);
    if (env.rank == 0) {
      std::fputs(table.c_str(), stdout);
      std::fflush(stdout);
    }

    TrainEnv tenv;
    tenv.comm = comm.get();
    tenv.backend = backend;
    tenv.local_rank = env.local_rank;
    tenv.local_size = env.local_size;
    tenv.threads = threads;
    tenv.host = env.host;
    tenv.resolved_toml = ToToml(cfg);
    // A live progress line only for a single process on a terminal: mpirun gives ranks a pty
    // even when its own output goes to a file or a pipe.
    tenv.interactive = env.world == 1 && !vars.local_rank && isatty(STDOUT_FILENO) != 0;
    Train(cfg, tenv);
  } catch (const AgreedError& e) {
    // Every rank holds the same error: rank 0 prints it, all exit alike.
    if (comm == nullptr || comm->rank() == 0) PrintError(e.what());
    comm.reset();
    return e.exit_code();
  } catch (const Error& e) {
    PrintError(e.what());
    MpiSession::Abort(e.exit_code());
  } catch (const std::exception& e) {
    PrintError(RankTag() + "internal error: " + e.what());
    MpiSession::Abort(kExitInternal);
  }
  comm.reset();
  return kExitOk;
}

int CmdInfo() {
  fmt::print("dptrain {}\n", DPTRAIN_VERSION);
  fmt::print("backends built: ");
  for (const auto& b : BuiltBackends()) fmt::print("{} ", b);
  fmt::print("\n");
  for (const auto& b : BuiltBackends()) {
    std::string why;
    const bool ok = BackendAvailable(b, &why);
    fmt::print("  {}: {}\n", b, ok ? "available" : "not available: " + why);
  }
  fmt::print("MPI: {}\n", MpiSession::LibraryVersion());
  const LauncherVars vars = ReadLauncherVars([](const char* n) { return std::getenv(n); });
  fmt::print("host {}: {} cores in the affinity mask", HostName(), AffinityCores());
  if (vars.local_rank) {
    fmt::print(", local rank {} (from {})", *vars.local_rank, vars.local_rank_source);
  }
  fmt::print("\n");
  return 0;
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
  using namespace dptrain;
  CLI::App app{"dptrain: data-parallel training of convolutional and fully connected networks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(DPTRAIN_VERSION));

  std::string config;
  std::vector<std::string> sets;
  auto* train = app.add_subcommand("train", "train a model (under mpirun/srun, or alone = 1 rank)");
  train->add_option("--config", config, "TOML run config")->required();
  train->add_option("--set", sets, "override a config key: --set train.lr=0.1 (repeatable)");

  std::string from, images, labels, input, out, split = "train";
  auto* convert = app.add_subcommand("convert", "convert a dataset to dptrain's HDF5 format");
  convert->add_option("--from", from, "idx | cifar10 | npy")->required();
  convert->add_option("--images", images, "idx or .npy images file");
  convert->add_option("--labels", labels, "idx or .npy labels file");
  convert->add_option("--input", input, "CIFAR-10 binary directory");
  convert->add_option("--split", split, "CIFAR-10 split: train | test");
  convert->add_option("--out", out, "output HDF5 file")->required();

  std::string inspect_path;
  auto* inspect = app.add_subcommand("inspect", "describe a dataset or checkpoint file");
  inspect->add_option("file", inspect_path, "HDF5 file")->required();

  auto* info = app.add_subcommand("info", "devices, bindings, library versions");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    if (IsWorldRankZeroByEnv()) {
      app.exit(e);
      std::fprintf(stderr, "run 'dptrain --help' or 'dptrain <command> --help' for usage\n");
    }
    return kExitUsage;
  }

  try {
    if (*train) return CmdTrain(config, sets, &argc, &argv);
    if (*info) return CmdInfo();
    if (*inspect) {
      std::fputs(DescribeHdf5File(inspect_path).c_str(), stdout);
      return kExitOk;
    }
    if (*convert) {
      if (from == "idx") {
        if (images.empty() || labels.empty()) {
          DPT_THROW(ConfigError) << "convert --from idx needs --images and --labels";
        }
        ConvertIdx(images, labels, out);
      } else if (from == "cifar10") {
        if (input.empty()) DPT_THROW(ConfigError) << "convert --from cifar10 needs --input DIR";
        ConvertCifar10(input, split, out);
      } else if (from == "npy") {
        if (images.empty() || labels.empty()) {
          DPT_THROW(ConfigError) << "convert --from npy needs --images and --labels";
        }
        ConvertNpy(images, labels, out);
      } else {
        DPT_THROW(ConfigError) << "convert --from: unknown format '" << from
                               << "' (idx, cifar10, npy)";
      }
      std::printf("wrote %s\n", out.c_str());
      return kExitOk;
    }
  } catch (const Error& e) {
    PrintError(e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    PrintError(std::string("internal error: ") + e.what());
    return kExitInternal;
  }
  return kExitUsage;
}
