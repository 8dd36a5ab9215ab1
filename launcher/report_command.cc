// SPDX-License-Identifier: Apache-2.0
// `dptrain report`: reads the run directories, writes the page atomically (a temporary name,
// then rename: a browser reloading it never sees half a file) and converts charts to PNG.
#include "launcher/report_command.h"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "runtime/report/report.h"

extern char** environ;  // NOLINT(readability-redundant-declaration): posix_spawnp's environment

namespace dptrain {
namespace {

namespace fs = std::filesystem;

void WriteFile(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    DPT_CHECK_AS(IoError, f.good())
        << "cannot write " << tmp.string() << ": " << std::strerror(errno);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  DPT_CHECK_AS(IoError, !ec) << "cannot rename " << tmp.string() << " to " << path.string() << ": "
                             << ec.message();
}

// Runs argv[0] (looked up in PATH) and waits; returns its exit status, -1 when it cannot start.
int Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void WriteImages(const report::Report& rep, const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DPT_CHECK_AS(IoError, !ec) << "cannot create " << dir.string() << ": " << ec.message();
  for (const auto& [id, svg] : rep.charts) {
    const fs::path svg_path = dir / (id + ".svg"), png_path = dir / (id + ".png");
    WriteFile(svg_path, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg + "\n");
    // Twice the chart's size: sharp on a slide or in a chat window.
    const int rc = Spawn({"rsvg-convert", "--zoom", "2", "--background-color", "white", "--output",
                          png_path.string(), svg_path.string()});
    DPT_CHECK_AS(ConfigError, rc != -1)
        << "PNG output needs rsvg-convert, which cannot be started: install the Debian package "
           "librsvg2-bin (scripts/install-deps.sh --runtime does); the HTML page is written";
    DPT_CHECK_AS(IoError, rc == 0)
        << "rsvg-convert failed (exit " << rc << ") converting " << svg_path.string();
  }
}

}  // namespace

int RunReportCommand(const ReportArgs& args) {
  std::vector<report::RunLog> runs;
  runs.reserve(args.run_dirs.size());
  for (const auto& d : args.run_dirs) runs.push_back(report::ReadRun(d));
  bool any = false;
  std::string why;
  for (const auto& r : runs) {
    any = any || r.used > 0;
    if (r.used == 0) {
      why += fmt::format("; {}: {}", r.dir,
                         !r.exists        ? "no such directory"
                         : !r.has_metrics ? "no metrics.jsonl"
                                          : "no usable record in metrics.jsonl");
    }
  }
  DPT_CHECK_AS(ConfigError, any)
      << "dptrain report: no metrics to show" << why
      << " (a run directory is the run_dir of dptrain train, with its metrics.jsonl)";

  const report::Report rep = report::BuildReport(runs);
  for (const auto& n : rep.notes) fmt::print(stderr, "dptrain report: skipped: {}\n", n);
  std::fflush(stderr);
  const fs::path out =
      args.out.empty() ? fs::path(args.run_dirs.front()) / "report.html" : fs::path(args.out);
  if (out.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(out.parent_path(), ec);
  }
  WriteFile(out, rep.html);
  fmt::print("report: {} ({} charts, {} KiB)\n", out.string(), rep.charts.size(),
             (rep.html.size() + 1023) / 1024);
  if (args.format == "png" || !args.png_dir.empty()) {
    fs::path dir = args.png_dir;
    if (dir.empty()) dir = out.parent_path() / (out.stem().string() + "-charts");
    WriteImages(rep, dir);
    fmt::print("charts: {}/ ({} PNG files, with their SVG)\n", dir.string(), rep.charts.size());
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace dptrain
