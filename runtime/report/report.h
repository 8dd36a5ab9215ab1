// SPDX-License-Identifier: Apache-2.0
// `dptrain report`: one self-contained HTML page (inline SVG charts and CSS, a few lines of
// script for a cursor read-out; nothing fetched over the network) from the run directories that
// runtime/report/run_log.h read. Several runs overlay their curves, and the table shows the keys
// in which they differ. Files are written by the caller (launcher/report_command.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/report/run_log.h"

namespace dptrain::report {

struct Report {
  std::string html;
  // Every chart of the page as a standalone SVG document: (id, svg), for PNG output.
  std::vector<std::pair<std::string, std::string>> charts;
  // What was skipped or is missing, one line each (prefixed with the run's name when several).
  std::vector<std::string> notes;
};

// Curves keep at most this many points each (DownsampleMinMax): a 100,000-step run's page stays
// well under 2 MB.
constexpr size_t kMaxCurvePoints = 1200;

// Renders `runs` (those with no usable record are listed in the notes, not drawn). Pure: no
// file access.
Report BuildReport(const std::vector<RunLog>& runs);

// The charts of BuildReport, in page order, grouped by section title (exposed for tests).
struct Section {
  std::string title;
  std::string intro;  // one sentence under the title ("" = none)
  std::vector<std::pair<std::string, std::string>> charts;  // (id, svg)
};
std::vector<Section> BuildCharts(const std::vector<const RunLog*>& runs);

// Legend names of the runs: their directory names, made unique ("fmnist", "fmnist (2)").
std::vector<std::string> RunLabels(const std::vector<const RunLog*>& runs);

// "42s", "3m05s", "1h02m"; "?" when not finite.
std::string Duration(double seconds);
// "512 B", "3.1 MiB", "2.00 GiB".
std::string Bytes(double bytes);

}  // namespace dptrain::report
