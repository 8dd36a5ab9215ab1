// SPDX-License-Identifier: Apache-2.0
// The report page (runtime/report/report.h): status, notes, the table of facts (only the keys
// that differ when several runs are shown), the chart sections, and a few lines of script that
// show the cursor's position in data units.
#include "runtime/report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "runtime/report/svg_chart.h"

namespace dptrain::report {
namespace {

constexpr const char* kCss = R"(
body{font:15px/1.45 "DejaVu Sans",Verdana,Arial,sans-serif;color:#222;background:#f4f4f2;
margin:0 auto;max-width:1500px;padding:12px 20px 40px}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:28px 0 6px;border-bottom:2px solid #ccc}
.sub{color:#555;margin:0 0 12px}.intro{margin:4px 0 10px;max-width:1100px;color:#333}
.tiles{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.tile{background:#fff;border:1px solid #ccc;border-radius:6px;padding:6px 14px;min-width:120px}
.tile b{display:block;font-size:24px}.tile span{color:#555;font-size:13px}
.status{border-radius:6px;padding:8px 12px;margin:10px 0;border:1px solid #999;background:#fff}
.status.failed{border:2px solid #b00;background:#fff3f3}.status.running{border:2px dashed #a60}
.notes{background:#fffbe6;border:1px solid #d9c36a;border-radius:6px;padding:4px 14px;margin:10px 0}
.notes li{margin:2px 0}table.facts{border-collapse:collapse;background:#fff;margin:8px 0}
.facts th,.facts td{border:1px solid #ccc;padding:3px 10px;text-align:left;vertical-align:top}
.facts th{background:#eee;font-weight:normal;color:#333}.facts thead th{font-weight:bold}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(540px,1fr));gap:14px;
align-items:start}
.facts-row{display:flex;flex-wrap:wrap;gap:0 24px;align-items:flex-start}
figure{margin:0;background:#fff;border:1px solid #ccc;border-radius:6px;padding:4px}
svg.chart{width:100%;height:auto;display:block}
pre{background:#fff;border:1px solid #ccc;padding:8px;overflow:auto;font-size:13px}
details{margin:8px 0}summary{cursor:pointer;color:#035}
@media print{body{background:#fff}figure{break-inside:avoid}}
)";

// The cursor read-out: a vertical line and "x ... y ..." in data units over every line chart.
constexpr const char* kScript = R"(
(function () {
  function fmt(v) {
    var a = Math.abs(v);
    return (a >= 1e5 || (a > 0 && a < 1e-3)) ? v.toExponential(2) : String(+v.toPrecision(4));
  }
  var ns = 'http://www.w3.org/2000/svg';
  document.querySelectorAll('svg[data-px0]').forEach(function (s) {
    var d = s.dataset, px0 = +d.px0, px1 = +d.px1, py0 = +d.py0, py1 = +d.py1;
    var x0 = +d.x0, x1 = +d.x1, y0 = +d.y0, y1 = +d.y1, lg = d.ylog === '1';
    var line = document.createElementNS(ns, 'line'), text = document.createElementNS(ns, 'text');
    line.setAttribute('stroke', '#777');
    line.setAttribute('y1', py1);
    line.setAttribute('y2', py0);
    line.setAttribute('visibility', 'hidden');
    text.setAttribute('x', px1);
    text.setAttribute('y', 20);
    text.setAttribute('text-anchor', 'end');
    s.appendChild(line);
    s.appendChild(text);
    function hide() { line.setAttribute('visibility', 'hidden'); text.textContent = ''; }
    s.addEventListener('mouseleave', hide);
    s.addEventListener('mousemove', function (e) {
      var p = s.createSVGPoint();
      p.x = e.clientX;
      p.y = e.clientY;
      p = p.matrixTransform(s.getScreenCTM().inverse());
      if (p.x < px0 || p.x > px1 || p.y < py1 || p.y > py0) { hide(); return; }
      var f = (py0 - p.y) / (py0 - py1);
      var xv = x0 + (p.x - px0) / (px1 - px0) * (x1 - x0);
      var yv = lg ? Math.pow(10, Math.log10(y0) + f * (Math.log10(y1) - Math.log10(y0)))
                  : y0 + f * (y1 - y0);
      line.setAttribute('x1', p.x);
      line.setAttribute('x2', p.x);
      line.setAttribute('visibility', 'visible');
      text.textContent = 'x ' + fmt(xv) + '   y ' + fmt(yv);
    });
  });
  document.body.setAttribute('data-charts', String(document.querySelectorAll('svg.chart').length));
})();
)";

std::string H(const std::string& s) { return XmlEscape(s); }

// One table cell: shown text, and the exact value for tools (the browser test reads it).
struct Cell {
  std::string text;
  std::string value;  // data-value ("" = none)
  bool operator==(const Cell& o) const { return text == o.text; }
};

struct Row {
  std::string key;    // data-key
  std::string label;  // shown
  std::vector<Cell> cells;
};

std::string StatusText(const RunLog& r) {
  if (r.status == "failed") {
    std::string s =
        r.error_step >= 0 ? fmt::format("failed after step {}", r.error_step) : "failed";
    if (r.error_exit_code >= 0) s += fmt::format(" (exit {})", r.error_exit_code);
    return s;
  }
  if (r.status == "running or stopped") {
    return fmt::format(
        "no summary yet: still running, or stopped without one (last record: "
        "step {}{})",
        r.last_step,
        std::isfinite(r.seconds_since_write)
            ? ", written " + Duration(r.seconds_since_write) + " ago"
            : "");
  }
  return r.status.empty() ? "no records" : r.status;
}

std::vector<Row> FactRows(const std::vector<const RunLog*>& runs) {
  std::vector<Row> rows;
  auto row = [&](const std::string& key, const std::string& label) -> Row& {
    for (Row& r : rows) {
      if (r.key == key) return r;
    }
    rows.push_back({key, label, std::vector<Cell>(runs.size())});
    return rows.back();
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLog& r = *runs[i];
    row("dir", "run directory").cells[i] = {r.dir, ""};
    row("status", "status").cells[i] = {StatusText(r), r.status};
    const EvalRecord* last_eval = r.evals.empty() ? nullptr : &r.evals.back();
    if (last_eval != nullptr && std::isfinite(last_eval->test_accuracy)) {
      row("final_accuracy", "final test accuracy").cells[i] = {
          fmt::format("{:.4f} ({:.2f}%) at step {}", last_eval->test_accuracy,
                      100 * last_eval->test_accuracy, last_eval->step),
          fmt::format("{}", last_eval->test_accuracy)};
    }
    if (last_eval != nullptr && std::isfinite(last_eval->test_loss)) {
      row("final_test_loss", "final test loss").cells[i] = {
          fmt::format("{:.4f}", last_eval->test_loss), fmt::format("{}", last_eval->test_loss)};
    }
    if (r.last_step >= 0) {
      row("steps", "steps").cells[i] = {std::to_string(r.last_step), std::to_string(r.last_step)};
    }
    if (!r.steps.empty()) {
      const StepRecord& last = r.steps.back();
      row("train_loss", "last training loss").cells[i] = {fmt::format("{:.4f}", last.loss),
                                                          fmt::format("{}", last.loss)};
      const double t = std::isfinite(r.total_time_s) ? r.total_time_s : last.time_s;
      row("total_time", "total time").cells[i] = {Duration(t), fmt::format("{}", t)};
      double sps = r.mean_samples_per_s;
      if (!std::isfinite(sps)) {
        double sum = 0;
        for (const StepRecord& s : r.steps)
          sum += std::isfinite(s.samples_per_s) ? s.samples_per_s : 0;
        sps = sum / static_cast<double>(r.steps.size());
      }
      row("samples_per_s", "samples/s (all ranks)").cells[i] = {fmt::format("{:.0f}", sps),
                                                                fmt::format("{}", sps)};
      double peak = kNaN;
      for (const StepRecord& s : r.steps) {
        if (std::isfinite(s.peak_mem_max)) peak = s.peak_mem_max;
      }
      if (std::isfinite(peak)) {
        row("peak_memory", "peak memory (largest rank)").cells[i] = {Bytes(peak),
                                                                     fmt::format("{}", peak)};
      }
    }
    if (r.checkpoints > 0) {
      row("checkpoints", "checkpoints written").cells[i] = {
          fmt::format("{} (last: {})", r.checkpoints, r.last_checkpoint), ""};
    }
    if (r.world_size > 0)
      row("ranks", "ranks").cells[i] = {std::to_string(r.world_size), std::to_string(r.world_size)};
    for (const auto& [k, v] : r.info) {
      std::string key = k;
      std::replace(key.begin(), key.end(), ' ', '_');
      row(key, k).cells[i] = {v, ""};
    }
  }
  if (runs.size() > 1) {  // config keys take part in the comparison
    for (size_t i = 0; i < runs.size(); ++i) {
      for (const auto& [k, v] : runs[i]->config) row("config." + k, k).cells[i] = {v, ""};
    }
  }
  return rows;
}

std::string FactsTable(const std::vector<const RunLog*>& runs,
                       const std::vector<std::string>& labels) {
  const std::vector<Row> rows = FactRows(runs);
  std::string shown, hidden, setup;
  int n_hidden = 0;
  bool setup_started = false;
  for (const Row& r : rows) {
    setup_started = setup_started || r.key == "ranks";
    const bool same =
        runs.size() > 1 && r.key != "dir" &&
        std::all_of(r.cells.begin(), r.cells.end(), [&](const Cell& c) { return c == r.cells[0]; });
    std::string tr = fmt::format("<tr data-key=\"{}\"><th>{}</th>", H(r.key), H(r.label));
    for (const Cell& c : r.cells) {
      tr += c.value.empty() ? fmt::format("<td>{}</td>", H(c.text))
                            : fmt::format("<td data-value=\"{}\">{}</td>", H(c.value), H(c.text));
    }
    tr += "</tr>\n";
    if (same) {
      hidden += tr;
      ++n_hidden;
    } else if (runs.size() == 1 && setup_started) {
      setup += tr;  // one run: how it ran, beside how it went
    } else {
      shown += tr;
    }
  }
  std::string head = "<thead><tr><th></th>";
  for (const auto& l : labels) head += "<th>" + H(l) + "</th>";
  head += "</tr></thead>";
  std::string out =
      runs.size() > 1 ? "<table class=\"facts\">" + head + "<tbody>" + shown + "</tbody></table>\n"
                      : "<div class=\"facts-row\"><table class=\"facts\"><tbody>" + shown +
                            "</tbody></table><table class=\"facts\"><tbody>" + setup +
                            "</tbody></table></div>\n";
  if (n_hidden > 0) {
    out += fmt::format(
        "<details><summary>{} more keys, equal in every run</summary><table class=\"facts\">"
        "{}<tbody>{}</tbody></table></details>\n",
        n_hidden, head, hidden);
  }
  return out;
}

std::string Tiles(const RunLog& r) {
  std::string t;
  auto tile = [&](const std::string& key, const std::string& big, const std::string& small) {
    t += fmt::format("<div class=\"tile\" data-key=\"{}\"><b>{}</b><span>{}</span></div>", key,
                     H(big), H(small));
  };
  if (!r.evals.empty() && std::isfinite(r.evals.back().test_accuracy)) {
    tile("final_accuracy", fmt::format("{:.2f}%", 100 * r.evals.back().test_accuracy),
         "final test accuracy");
  }
  if (r.last_step >= 0) tile("steps", std::to_string(r.last_step), "steps");
  if (r.world_size > 0) tile("ranks", std::to_string(r.world_size), "ranks");
  if (!r.steps.empty()) {
    const double t_s = std::isfinite(r.total_time_s) ? r.total_time_s : r.steps.back().time_s;
    tile("total_time", Duration(t_s), "total time");
  }
  return t.empty() ? "" : "<div class=\"tiles\">" + t + "</div>\n";
}

}  // namespace

std::vector<std::string> RunLabels(const std::vector<const RunLog*>& runs) {
  std::vector<std::string> out;
  std::map<std::string, int> seen;
  for (const RunLog* r : runs) {
    const int k = ++seen[r->name];
    out.push_back(k == 1 ? r->name : fmt::format("{} ({})", r->name, k));
  }
  return out;
}

std::string Duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(std::llround(s));
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return s < 10 ? fmt::format("{:.1f}s", s) : fmt::format("{}s", t);
}

std::string Bytes(double b) {
  if (!std::isfinite(b)) return "?";
  if (b >= static_cast<double>(1LL << 30)) return fmt::format("{:.2f} GiB", b / (1LL << 30));
  if (b >= static_cast<double>(1LL << 20)) return fmt::format("{:.1f} MiB", b / (1LL << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", b / 1024);
  return fmt::format("{:.0f} B", b);
}

Report BuildReport(const std::vector<RunLog>& all) {
  Report rep;
  std::vector<const RunLog*> runs;
  for (const RunLog& r : all) {
    if (r.used > 0) runs.push_back(&r);
  }
  for (const RunLog& r : all) {
    for (const std::string& n : r.notes) rep.notes.push_back(all.size() > 1 ? r.dir + ": " + n : n);
    if (r.used == 0 && r.exists) {
      rep.notes.push_back((all.size() > 1 ? r.dir + ": " : "") +
                          "no usable metrics record: not shown");
    }
  }
  const std::vector<std::string> labels = RunLabels(runs);
  std::string names;
  for (const auto& l : labels) names += (names.empty() ? "" : ", ") + l;

  std::string body;
  body += fmt::format("<h1>dptrain report: {}</h1>\n", H(names));
  std::string dirs;
  for (const RunLog* r : runs) dirs += (dirs.empty() ? "" : " · ") + H(r->dir);
  body += fmt::format("<p class=\"sub\">{}</p>\n", dirs);
  if (runs.size() == 1) body += Tiles(*runs[0]);
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLog& r = *runs[i];
    const std::string who = runs.size() > 1 ? "<b>" + H(labels[i]) + "</b>: " : "";
    if (r.status == "failed") {
      body += fmt::format(
          "<div class=\"status failed\" "
          "data-key=\"error\">{}<b>{}</b>{}<br><code>{}</code></div>\n",
          who, H(StatusText(r)),
          r.error_source.empty() ? "" : " — recorded in " + H(r.error_source), H(r.error));
    } else if (r.status == "running or stopped") {
      body += fmt::format("<div class=\"status running\">{}{}</div>\n", who, H(StatusText(r)));
    }
  }
  if (!rep.notes.empty()) {
    body += "<div class=\"notes\" data-key=\"notes\"><p><b>Skipped or missing</b></p><ul>\n";
    for (const auto& n : rep.notes) body += "<li>" + H(n) + "</li>\n";
    body += "</ul></div>\n";
  }
  body += FactsTable(runs, labels);
  if (runs.size() == 1 && !runs[0]->config_text.empty()) {
    body += "<details><summary>config.toml (the resolved configuration)</summary><pre>" +
            H(runs[0]->config_text) + "</pre></details>\n";
  }
  for (const Section& s : BuildCharts(runs)) {
    body += "<h2>" + H(s.title) + "</h2>\n";
    if (!s.intro.empty()) body += "<p class=\"intro\">" + H(s.intro) + "</p>\n";
    body += "<div class=\"grid\">\n";
    for (const auto& [id, svg] : s.charts) {
      body += "<figure>" + svg + "</figure>\n";
      rep.charts.emplace_back(id, svg);
    }
    body += "</div>\n";
  }
  rep.html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>dptrain report: {}</title><style>{}</style></head>\n<body>\n{}"
      "<p class=\"sub\">Written by dptrain report. Curves keep each interval's minimum and "
      "maximum when downsampled; hover a chart for the cursor's values.</p>\n"
      "<script>{}</script>\n</body></html>\n",
      H(names), kCss, body, kScript);
  return rep;
}

}  // namespace dptrain::report
