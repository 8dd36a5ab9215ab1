// SPDX-License-Identifier: Apache-2.0
// The dptrain command line: subcommands train, eval, convert, inspect, info, plan, report. Only the
// argument parsing, the dispatch to each subcommand's file (launcher/*_command.h) and the error ->
// exit code mapping of DESIGN.md section 8 live here; errors are printed once (MPI_Abort when only
// some ranks failed, inside RunTrainOrEval, so no peer is left blocked in a collective).
#include "launcher/cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "launcher/binding_policy.h"
#include "launcher/config.h"
#include "launcher/convert_command.h"
#include "launcher/info_command.h"
#include "launcher/inspect_command.h"
#include "launcher/plan_command.h"
#include "launcher/process_env.h"
#include "launcher/report_command.h"
#include "launcher/run_command.h"

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

}  // namespace

void PrintError(const std::string& what) {
  std::fprintf(stderr, "dptrain: error: %s\n", what.c_str());
  std::fflush(stderr);
}

int RunCommandLine(int argc, char** argv, const TrainHooks& hooks) {
  SetProcessContextFromEnv();
  // CLI11 reports "A subcommand is required" before looking at an unknown word: name it.
  static const char* kCommands[] = {"train", "eval", "convert", "inspect",
                                    "info",  "plan", "report"};
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(std::begin(kCommands), std::end(kCommands),
                   [&](const char* c) { return std::strcmp(c, argv[1]) == 0; })) {
    if (PrintsPreMpiErrors()) {
      PrintError(std::string("unknown command '") + argv[1] +
                 "' (commands: train, eval, convert, inspect, info, plan, report); run "
                 "'dptrain --help'");
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
  std::string run_gpus;
  const char* gpus_help =
      "as dist.gpus: the visible GPUs to bind ranks to, e.g. 2,3 (same as --set dist.gpus=2,3; "
      "given last, so it wins over one)";
  train->add_option("--gpus", run_gpus, gpus_help);
  train
      ->add_option("--requeue-exit-code", run.requeue_exit_code,
                   "exit code after a preemption signal (SIGTERM, SIGUSR1) stopped training and "
                   "the checkpoint was written (default 0)")
      ->check(CLI::Range(0, 255));

  auto* eval = app.add_subcommand("eval", "evaluate a checkpoint on data.test (every rank)");
  eval->add_option("--config", run.config_path, "TOML run config (model, data.test)")->required();
  eval->add_option("--checkpoint", run.checkpoint, "checkpoint file (.h5)")->required();
  eval->add_option("--set", run.sets, "override a config key: --set data.test=x.h5 (repeatable)");
  eval->add_option("--gpus", run_gpus, gpus_help);

  ConvertArgs conv;
  auto* convert = app.add_subcommand("convert", "convert a dataset to dptrain's HDF5 format");
  convert->add_option("--from", conv.from, "idx | cifar10 | npy | imagefolder")->required();
  convert->add_option("--images", conv.images, "idx or .npy images file");
  convert->add_option("--labels", conv.labels, "idx or .npy labels file");
  convert->add_option("--input", conv.input,
                      "CIFAR-10 binary directory; imagefolder: DIR/<class>/<image>");
  convert->add_option("--split", conv.split, "CIFAR-10 split: train | test");
  convert->add_option("--layout", conv.layout,
                      "npy: rank-4 images are nchw | nhwc | auto (default: nhwc when the last "
                      "dimension is 1, 3 or 4 and the second is not)");
  convert
      ->add_option("--out", conv.out, "output HDF5 file (sharded: OUT-00000.h5, OUT-00001.h5, ...)")
      ->required();
  convert->add_option("--size", conv.size,
                      "imagefolder: resize the shorter side to S, centre-crop S x S");
  convert->add_option("--shard-size", conv.shard_size,
                      "imagefolder: at most this many pixel bytes per file, e.g. 10GB, 512MiB");
  convert->add_flag("--skip-bad", conv.skip_bad,
                    "imagefolder: leave unreadable images out (listed) instead of exit 3");
  convert->add_option("--threads", conv.threads,
                      "imagefolder: decode/resize threads (default: all cores)");

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
                   "launcher, else 1)")
      ->check(CLI::Range(1, 1 << 20));
  plan->add_flag("--json", plan_json, "print JSON instead of a table");

  auto* info = app.add_subcommand("info", "devices, bindings, library versions");
  DistConfig info_dist;
  std::string info_binding = ConfigName(info_dist.device_binding);
  info->add_option("--gpus", info_dist.gpus, "as dist.gpus: show the binding for this list");
  info->add_option("--device-binding", info_binding, "as dist.device_binding")
      ->check(CLI::IsMember({"remap", "set-device"}));

  ReportArgs rep;
  auto* report = app.add_subcommand(
      "report", "one self-contained HTML page of a run's charts (several runs: overlaid)");
  report->add_option("run_dirs", rep.run_dirs, "run directories (run_dir of dptrain train)")
      ->required()
      ->expected(1, -1);
  report->add_option("--out", rep.out, "the HTML file (default: RUN_DIR/report.html)");
  report->add_option("--format", rep.format, "png: also write every chart as PNG and SVG")
      ->check(CLI::IsMember({"html", "png"}));
  report->add_option("--png", rep.png_dir,
                     "write the charts as PNG and SVG into this folder (default with --format "
                     "png: next to --out, in <name>-charts/)");

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

  if (!run_gpus.empty()) run.sets.push_back("dist.gpus=" + run_gpus);
  try {
    if (*train) return RunTrainOrEval(run, &argc, &argv);
    if (*eval) {
      run.eval = true;
      return RunTrainOrEval(run, &argc, &argv);
    }
    if (*info) {
      info_dist.device_binding = ParseBindingPolicy(info_binding);
      return RunInfoCommand(info_dist);
    }
    if (*plan) return RunPlanCommand(LoadConfig(plan_config, plan_sets), plan_ranks, plan_json);
    if (*inspect) return RunInspectCommand(inspect_path);
    if (*report) return RunReportCommand(rep);
    if (*convert) return RunConvertCommand(conv);
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
