// SPDX-License-Identifier: Apache-2.0
// The dptrain command line: subcommands train, eval, convert, inspect, info, plan. The only place
// that decides a process's fate: errors are printed once and turned into the exit codes of
// DESIGN.md section 8 (MPI_Abort when only some ranks failed, so no peer is left blocked in a
// collective); a run stopped by a preemption signal exits 0 or the code of --requeue-exit-code.
#include "launcher/cli.h"

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/backend_registry.h"
#include "core/error.h"
#include "datasets/convert/convert.h"
#include "datasets/inspect.h"
#include "launcher/binding_policy.h"
#include "launcher/config.h"
#include "launcher/gpu_binder.h"
#include "launcher/nvml_probe.h"
#include "launcher/plan_command.h"
#include "launcher/process_env.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/device_communicator.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/routing_communicator.h"
#include "runtime/comm/watchdog.h"
#include "runtime/trainer.h"

namespace dptrain {
namespace {

// Before MPI_Init we only know our rank from the launcher's variables; print pre-MPI errors
// (bad command line, bad config: identical on every rank) once, from world rank 0.
bool PrintsPreMpiErrors() { return IsWorldRankZeroByEnv(SystemGetEnv()); }

// Exit code of a command-line error found before MPI_Init. The error is the same on every rank
// (same argv) and world rank 0 prints it; the other ranks wait a moment before exiting, because
// mpirun kills the whole job at the first non-zero exit, which could be before rank 0 printed.
int UsageExit(int code) {
  if (!PrintsPreMpiErrors()) std::this_thread::sleep_for(std::chrono::seconds(3));
  return code;
}

// Rank, world and host for error messages printed before MPI_Init (launcher variables; the
// values MPI reports replace them as soon as it is up).
void SetProcessContextFromEnv() {
  ProcessContext ctx;
  ctx.host = HostName();
  if (const auto launched = LauncherRankAndWorld(SystemGetEnv())) {
    ctx.rank = launched->rank;
    ctx.world = launched->world;
  }
  SetProcessContext(ctx);
}

void PrintError(const std::string& what) {
  std::fprintf(stderr, "dptrain: error: %s\n", what.c_str());
  std::fflush(stderr);
}

// `train` and `eval`: both start MPI, bind the backend and run on every rank.
struct RunArgs {
  std::string config_path;
  std::vector<std::string> sets;
  bool eval = false;
  std::string checkpoint;     // eval: the checkpoint to evaluate
  int requeue_exit_code = 0;  // train: exit code after a preemption signal
  TrainHooks hooks;           // tests only
};

int CmdRun(const RunArgs& args, int* argc, char*** argv) {
  const std::string& config_path = args.config_path;
  const std::vector<std::string>& sets = args.sets;
  const bool eval = args.eval;
  // Launcher variables are read before MPI_Init (and before anything touches a GPU).
  const GetEnvFn getenv_fn = SystemGetEnv();
  const LauncherVars vars = ReadLauncherVars(getenv_fn);
  TrainConfig cfg;
  // A bad config is held until MPI is up and then agreed on like any other error: rank 0 prints
  // the message of the lowest failing rank and every rank exits with its code. Returning before
  // MPI_Init instead races the launcher (mpirun kills rank 0 before it has printed when another
  // rank exits first) and stays silent when only a non-zero rank cannot read the file.
  std::optional<Error> config_error;
  try {
    cfg = LoadConfig(config_path, sets);
  } catch (const Error& e) {
    if (!UnderLauncher(getenv_fn)) {  // a single process: nothing to agree with
      PrintError(e.what());
      return e.exit_code();
    }
    config_error = e;
    cfg = TrainConfig{};
  }

  // Device binding before MPI_Init and before any CUDA call (DESIGN.md section 4): CUDA reads
  // CUDA_VISIBLE_DEVICES once, and a CUDA-aware MPI may initialise CUDA inside MPI_Init.
  GpuBinder binder(cfg.dist, getenv_fn);
  if (vars.local_rank && !config_error) {
    binder.BindEarly(*vars.local_rank, vars.local_size.value_or(0));
  }

  // Preemption signals are taken over before MPI_Init starts threads that would inherit an
  // unblocked signal mask (InstallStopSignalHandlers).
  if (!eval && !config_error) InstallStopSignalHandlers();
  MpiSession mpi(argc, argv);
  std::unique_ptr<Communicator> comm;
  try {
    comm = mpi.World();
    RunAgreed(*comm, [&] {
      if (config_error) throw *config_error;
    });
    ProcessEnv env;
    env.rank = comm->rank();
    env.world = comm->size();
    env.host = HostName();
    env.vars = vars;
    mpi.LocalRankAndSize(&env.local_rank, &env.local_size);
    SetProcessContext({env.rank, env.world, env.host});
    // No collective may block longer than dist.collective_timeout_s (exit 5 naming the ranks
    // that did not arrive); NCCL communicators are aborted first.
    Watchdog::Start(cfg.dist.collective_timeout_s, mpi.thread_multiple());
    Watchdog::AddAbortHook([] { AbortDeviceCommunicators(); });

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

    // Deterministic mode: a thread count that depends on the config alone (not on the cores or
    // OMP_NUM_THREADS of the machine), since the CPU kernels' reduction order depends on it.
    const int threads = cfg.train.deterministic
                            ? static_cast<int>(std::max<int64_t>(cfg.dist.threads, 1))
                            : ChooseThreads(cfg.dist.threads, std::getenv("OMP_NUM_THREADS"),
                                            AffinityCores(), OnlineCores(), env.local_size);
    std::string device;
    Backend* backend = nullptr;
    RunAgreed(*comm, [&] {
      // "auto" resolves without touching CUDA (NVML); then the device is bound and selected.
      device = binder.Bind(env.local_rank, env.local_size);
      if (binder.binding()) SelectDevice(device, binder.binding()->cuda_ordinal);
      backend = &GetBackend(device);
      backend->SetThreads(threads);
      if (cfg.memory.limit_bytes > 0) backend->allocator().set_budget(cfg.memory.limit_bytes);
    });
    const std::string table = RankTable(*comm, env, device, threads);
    if (env.rank == 0) {
      std::fputs(table.c_str(), stdout);
      std::fflush(stdout);
    }
    if (const auto gpu = BackendDevice(*backend)) {
      // Every rank on its own GPU: all ranks hold the same rows and reach the same verdict.
      BoundDevice mine{env.rank,  env.host,  env.local_rank, binder.binding()->entry,
                       gpu->name, gpu->uuid, gpu->pci_bus_id};
      std::string bindings;
      try {
        bindings = ExchangeBindings(*comm, mine, binder.allow_sharing());
      } catch (const ConfigError& e) {
        throw AgreedError(e.what(), e.exit_code());
      }
      if (env.rank == 0) {
        std::fputs(bindings.c_str(), stdout);
        std::fflush(stdout);
      }
    }

    // Device tensors (gradient buckets, parameter broadcasts) go over NCCL, host values
    // (agreements, metrics) over MPI; the trainer sees one communicator that routes by device.
    const bool on_gpu = backend->device() != Device::kCpu;
    RunAgreed(*comm, [&] {
      DPT_CHECK_AS(ConfigError, !(on_gpu && cfg.dist.backend == CommBackend::kMpi))
          << "dist.backend = \"mpi\" cannot reduce GPU memory (the MPI communicator works on "
          << "host buffers); use \"nccl\" or \"auto\" with dist.device = \"" << device << "\"";
      DPT_CHECK_AS(ConfigError, on_gpu || cfg.dist.backend != CommBackend::kNccl)
          << "dist.backend = \"nccl\" needs GPUs, but this run uses the CPU (dist.device = \""
          << ConfigName(cfg.dist.device) << "\" resolved to \"" << device << "\")";
    });
    std::unique_ptr<Communicator> device_comm, routed;
    if (on_gpu) {
      device_comm = CreateDeviceCommunicator(*backend, *comm, cfg.dist.collective_timeout_s);
      routed = std::make_unique<RoutingCommunicator>(*comm, *device_comm);
    }

    TrainEnv tenv;
    tenv.comm = routed != nullptr ? routed.get() : comm.get();
    tenv.backend = backend;
    tenv.local_rank = env.local_rank;
    tenv.local_size = env.local_size;
    tenv.threads = threads;
    tenv.host = env.host;
    tenv.resolved_toml = ToToml(cfg);
    tenv.hooks = args.hooks;
    // A live progress line only for a single process on a terminal: mpirun gives ranks a pty
    // even when its own output goes to a file or a pipe.
    tenv.interactive = env.world == 1 && !vars.local_rank && isatty(STDOUT_FILENO) != 0;
    if (eval) {
      EvaluateCheckpoint(cfg, tenv, args.checkpoint);
    } else {
      const TrainResult r = Train(cfg, tenv);
      if (r.stop_signal != 0 && args.requeue_exit_code != 0) {
        if (env.rank == 0) {
          std::printf(
              "dptrain: exiting with code %d (--requeue-exit-code) so that the job is "
              "requeued\n",
              args.requeue_exit_code);
          std::fflush(stdout);
        }
        comm.reset();
        return args.requeue_exit_code;
      }
    }
  } catch (const AgreedError& e) {
    // Every rank holds the same error: rank 0 prints it, all exit alike.
    if (comm == nullptr || comm->rank() == 0) PrintError(e.what());
    comm.reset();
    return e.exit_code();
  } catch (const Error& e) {
    PrintError(e.what());
    AbortDeviceCommunicators();
    MpiSession::Abort(e.exit_code());
  } catch (const std::exception& e) {
    PrintError(RankTag() + "internal error: " + e.what());
    AbortDeviceCommunicators();
    MpiSession::Abort(kExitInternal);
  }
  comm.reset();
  return kExitOk;
}

int CmdInfo(const DistConfig& dist) {
  fmt::print("dptrain {}\n", DPTRAIN_VERSION);
  const GetEnvFn getenv_fn = SystemGetEnv();
  const LauncherVars vars = ReadLauncherVars(getenv_fn);
  fmt::print("host {}: {} cores in the affinity mask", HostName(), AffinityCores());
  if (vars.local_rank) {
    fmt::print(", local rank {} (from {})", *vars.local_rank, vars.local_rank_source);
  }
  fmt::print("\n");
  // NVML first: it creates no CUDA context, and the binding lines below use its count.
  const GpuInventory gpus = ProbeGpus();
  fmt::print("{}", DescribeGpus(gpus));
  fmt::print("{}", DescribeBindings(dist, gpus, getenv_fn, vars.local_size.value_or(0)));
  fmt::print("backends built: ");
  for (const auto& b : BuiltBackends()) fmt::print("{} ", b);
  fmt::print("\n");
  for (const auto& b : BuiltBackends()) {
    std::string why;
    const bool ok = BackendAvailable(b, &why);
    fmt::print("  {}: {}\n", b, ok ? "available" : "not available: " + why);
  }
  fmt::print("libraries:\n");
  for (const auto& [lib, version] : BackendLibraryVersions()) {
    fmt::print("  {:<13} {}\n", lib, version);
  }
  fmt::print("  {:<13} {}\n", "MPI", MpiSession::LibraryVersion());
  fmt::print("  {:<13} {}\n", "HDF5", Hdf5LibraryVersion());
  return 0;
}

}  // namespace

int RunCommandLine(int argc, char** argv, const TrainHooks& hooks) {
  SetProcessContextFromEnv();
  // CLI11 reports "A subcommand is required" before looking at an unknown word: name it.
  static const char* kCommands[] = {"train", "eval", "convert", "inspect", "info", "plan"};
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(std::begin(kCommands), std::end(kCommands),
                   [&](const char* c) { return std::strcmp(c, argv[1]) == 0; })) {
    if (PrintsPreMpiErrors()) {
      PrintError(std::string("unknown command '") + argv[1] +
                 "' (commands: train, eval, convert, inspect, info, plan); run 'dptrain --help'");
    }
    return UsageExit(kExitUsage);
  }
  CLI::App app{"dptrain: data-parallel training of convolutional and fully connected networks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(DPTRAIN_VERSION));

  RunArgs run;
  run.hooks = hooks;
  auto* train = app.add_subcommand("train", "train a model (under mpirun/srun, or alone = 1 rank)");
  train->add_option("--config", run.config_path, "TOML run config")->required();
  train->add_option("--set", run.sets, "override a config key: --set train.lr=0.1 (repeatable)");
  train
      ->add_option("--requeue-exit-code", run.requeue_exit_code,
                   "exit code after a preemption signal (SIGTERM, SIGUSR1) stopped training and "
                   "the checkpoint was written (default 0)")
      ->check(CLI::Range(0, 255));

  auto* eval = app.add_subcommand("eval", "evaluate a checkpoint on data.test (every rank)");
  eval->add_option("--config", run.config_path, "TOML run config (model, data.test)")->required();
  eval->add_option("--checkpoint", run.checkpoint, "checkpoint file (.h5)")->required();
  eval->add_option("--set", run.sets, "override a config key: --set data.test=x.h5 (repeatable)");

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

  std::string plan_config;
  std::vector<std::string> plan_sets;
  int plan_ranks = 0;
  bool plan_json = false;
  auto* plan =
      app.add_subcommand("plan", "per-layer memory estimate per rank, largest batch that fits");
  plan->add_option("--config", plan_config, "TOML run config")->required();
  plan->add_option("--set", plan_sets, "override a config key (repeatable)");
  plan->add_option("--ranks", plan_ranks,
                   "ranks the job will run with (default: from the "
                   "launcher, else 1)");
  plan->add_flag("--json", plan_json, "print JSON instead of a table");

  auto* info = app.add_subcommand("info", "devices, bindings, library versions");
  DistConfig info_dist;
  std::string info_binding = ConfigName(info_dist.device_binding);
  info->add_option("--gpus", info_dist.gpus, "as dist.gpus: show the binding for this list");
  info->add_option("--device-binding", info_binding, "as dist.device_binding")
      ->check(CLI::IsMember({"remap", "set-device"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    if (PrintsPreMpiErrors()) {
      app.exit(e);
      std::fprintf(stderr, "run 'dptrain --help' or 'dptrain <command> --help' for usage\n");
    }
    return UsageExit(kExitUsage);
  }

  try {
    if (*train) return CmdRun(run, &argc, &argv);
    if (*eval) {
      run.eval = true;
      return CmdRun(run, &argc, &argv);
    }
    if (*info) {
      info_dist.device_binding = ParseBindingPolicy(info_binding);
      return CmdInfo(info_dist);
    }
    if (*plan) return RunPlanCommand(LoadConfig(plan_config, plan_sets), plan_ranks, plan_json);
    if (*inspect) {
      // Checkpoints get their own description (state, tensors with checksum verdicts, config).
      std::fputs(IsCheckpointFile(inspect_path) ? DescribeCheckpoint(inspect_path).c_str()
                                                : DescribeHdf5File(inspect_path).c_str(),
                 stdout);
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

}  // namespace dptrain
