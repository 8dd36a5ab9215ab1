// SPDX-License-Identifier: Apache-2.0
// `dptrain report RUN_DIR... [--out FILE.html] [--format png | --png DIR]`: one self-contained
// HTML page of the runs' charts (runtime/report/report.h), and optionally every chart as SVG and
// PNG (PNG by rsvg-convert, Debian package librsvg2-bin). A single process, no MPI.
#pragma once

#include <string>
#include <vector>

namespace dptrain {

struct ReportArgs {
  std::vector<std::string> run_dirs;
  std::string out;              // default: <first RUN_DIR>/report.html
  std::string format = "html";  // "png": also write the charts as images
  std::string png_dir;          // the images' folder (implies images); default: <out>-charts/
};

// Writes the page (and images); prints their paths and every skipped input (stderr). Returns
// the exit code. Throws ConfigError (exit 2) when no run directory holds a usable metrics
// record or rsvg-convert is missing for images, IoError (exit 3) when a file cannot be written.
int RunReportCommand(const ReportArgs& args);

}  // namespace dptrain
