// SPDX-License-Identifier: Apache-2.0
// `dptrain train` and `dptrain eval`: the per-rank sequence from launcher variables to a running
// trainer (bind, MPI, agree, pick the backend, route collectives) and its error handling.
#include "launcher/run_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "core/backend_registry.h"
#include "core/error.h"
#include "launcher/cli.h"
#include "launcher/config.h"
#include "launcher/gpu_binder.h"
#include "launcher/process_env.h"
#include "runtime/comm/device_communicator.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/watchdog.h"
#include "runtime/trainer.h"

namespace dptrain {

int RunTrainOrEval(const RunArgs& args, int* argc, char*** argv) {
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
  std::unique_ptr<MpiCommunicator> comm;
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
    // A malformed OMP_NUM_THREADS is agreed on like any setup error (one message, exit 2).
    int threads = 1;
    RunAgreed(*comm, [&] {
      threads = cfg.train.deterministic
                    ? static_cast<int>(std::max<int64_t>(cfg.dist.threads, 1))
                    : ChooseThreads(cfg.dist.threads, std::getenv("OMP_NUM_THREADS"),
                                    AffinityCores(), OnlineCores(), env.local_size);
    });
    std::string device;
    Backend* backend = nullptr;
    RunAgreed(*comm, [&] {
      // "auto" resolves without touching CUDA (NVML); then the device is bound and selected.
      device = binder.Bind(env.local_rank, env.local_size);
      if (binder.binding()) SelectDevice(device, binder.binding()->cuda_ordinal);
      backend = &GetBackend(device);
      backend->SetThreads(threads);
      backend->SetDeterministic(cfg.train.deterministic);
      backend->SetTimedAlgorithmSearch(cfg.train.cudnn_benchmark);
      backend->SetWinograd(cfg.train.winograd);
      backend->SetTf32(cfg.train.tf32);
      if (cfg.memory.limit_bytes > 0) backend->allocator().set_budget(cfg.memory.limit_bytes);
    });
    const std::string table = RankTable(*comm, env, device, threads);
    if (env.rank == 0) {
      std::fputs(table.c_str(), stdout);
      // Every task of an srun --gpus-per-task=N>1 launch is in the same position: say it once.
      if (binder.binding() && !binder.binding()->warning.empty()) {
        std::printf("dptrain: warning: %s\n", binder.binding()->warning.c_str());
      }
      std::fflush(stdout);
    }
    if (const auto gpu = BackendDevice(*backend)) {
      // Every rank on its own GPU: all ranks hold the same rows and reach the same verdict.
      BoundDevice mine{env.rank,  env.host,  env.local_rank, binder.binding()->entry,
                       gpu->name, gpu->uuid, gpu->pci_bus_id};
      std::string bindings;
      try {
        bindings = ExchangeBindings(*comm, mine, binder.sharing_requested(), args.hooks.share_gpu);
      } catch (const ConfigError& e) {
        throw AgreedError(e.what(), e.exit_code());
      }
      if (env.rank == 0) {
        std::fputs(bindings.c_str(), stdout);
        std::fflush(stdout);
      }
      if (args.hooks.share_gpu) ShareGpuOverNcclSockets(env.rank);
    }

    // MPI for agreements (the control plane), NCCL or MPI for gradients: on GPUs the tensor
    // collectives (gradient buckets, parameter broadcasts) go over NCCL, on the CPU over MPI.
    const bool on_gpu = backend->device() != Device::kCpu;
    RunAgreed(*comm, [&] {
      DPT_CHECK_AS(ConfigError, !(on_gpu && cfg.dist.backend == CommBackend::kMpi))
          << "dist.backend = \"mpi\" cannot reduce GPU memory (the MPI communicator works on "
          << "host buffers); use \"nccl\" or \"auto\" with dist.device = \"" << device << "\"";
      DPT_CHECK_AS(ConfigError, on_gpu || cfg.dist.backend != CommBackend::kNccl)
          << "dist.backend = \"nccl\" needs GPUs, but this run uses the CPU (dist.device = \""
          << ConfigName(cfg.dist.device) << "\" resolved to \"" << device << "\")";
    });
    // The guard aborts the device communicator when an exception unwinds past it, instead of
    // finalizing it gracefully (which waits for every peer): the catch below must print the
    // error and MPI_Abort at once, not after dist.collective_timeout_s.
    DeviceCommunicatorGuard device_comm(
        on_gpu ? CreateDeviceCommunicator(*backend, *comm, cfg.dist.collective_timeout_s)
               : nullptr);

    TrainEnv tenv;
    tenv.control = comm.get();
    tenv.comm = device_comm.get() != nullptr ? device_comm.get() : comm.get();
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
    // Unwinding has already aborted (not finalized) the device communicators, so nothing waited
    // for peers before this line: print first, then abort whatever is left and end every rank.
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

}  // namespace dptrain
