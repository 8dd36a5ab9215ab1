// SPDX-License-Identifier: Apache-2.0
// The charts of a report (runtime/report/report.h): which curves each chart overlays, with
// what units, downsampled and smoothed how. runtime/report/svg_chart.cc draws them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "runtime/report/report.h"
#include "runtime/report/svg_chart.h"

namespace dptrain::report {
namespace {

bool AnyFinite(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double a) { return std::isfinite(a); });
}

// Wall-time axis unit for a span of `max_s` seconds.
std::pair<double, std::string> TimeUnit(double max_s) {
  if (!(max_s < 2 * 3600.0)) return {3600.0, "h"};
  if (max_s >= 600) return {60.0, "min"};
  return {1.0, "s"};
}

std::pair<double, std::string> ByteUnit(double max_bytes) {
  if (max_bytes >= 10.0 * (1LL << 30)) return {static_cast<double>(1LL << 30), "GiB"};
  if (max_bytes >= 10.0 * (1LL << 20)) return {static_cast<double>(1LL << 20), "MiB"};
  return {1024.0, "KiB"};
}

// A step field as a series against the step (or the wall time).
template <class F>
Series StepSeries(const RunLog& r, F field, bool vs_time = false, double time_div = 1) {
  Series s;
  for (const StepRecord& st : r.steps) {
    s.Add(vs_time ? st.time_s / time_div : static_cast<double>(st.step), field(st));
  }
  return s;
}

// The ids of a per-run chart: "time-split" for one run, "time-split-2" for the second of several.
std::string RunId(const char* base, size_t i, size_t n) {
  return n == 1 ? std::string(base) : fmt::format("{}-{}", base, i + 1);
}

std::string RunTitle(const std::string& title, const std::string& label, size_t n) {
  return n == 1 ? title : title + " — " + label;
}

// Raw (faint) and smoothed curves of one run's field.
void AddRawAndSmoothed(const Series& raw, const Style& st, const std::string& label, size_t n,
                       std::vector<Curve>* out) {
  // Smoothing over ~2% of the points; a short series (fewer than ~150 logged steps) is drawn
  // as it is, since an average over a large share of it lags visibly behind the data.
  const double window = static_cast<double>(raw.size()) / 50.0;
  if (window < 3) {
    Curve line;
    line.label = n == 1 ? "" : label;
    line.points = DownsampleMinMax(raw, kMaxCurvePoints);
    line.style = st;
    line.width = 1.8;
    out->push_back(std::move(line));
    return;
  }
  Curve faint;
  faint.label = n == 1 ? "raw (per logged step)" : "";
  faint.points = DownsampleMinMax(raw, kMaxCurvePoints);
  faint.style = st;
  faint.style.dash = "";
  faint.width = 1;
  faint.opacity = 0.35;
  Curve smooth;
  smooth.label = n == 1 ? "smoothed" : label;
  smooth.points = DownsampleMinMax(Smooth(raw, window), kMaxCurvePoints);
  smooth.style = st;
  smooth.width = 2.2;
  out->push_back(std::move(faint));
  out->push_back(std::move(smooth));
}

std::vector<VMark> Marks(const RunLog& r, bool vs_time, double time_div) {
  std::vector<VMark> m;
  std::map<int64_t, double> time_at;  // step -> time, for skipped steps against wall time
  for (const StepRecord& st : r.steps) {
    time_at[st.step] = st.time_s / time_div;
    for (int64_t s : st.skipped_at) {
      VMark v;
      v.x = vs_time ? st.time_s / time_div : static_cast<double>(s);
      v.label = "skipped step (loss scaling)";
      v.color = "#c00";
      m.push_back(v);
    }
  }
  if (r.status == "failed" && r.error_step >= 0) {
    VMark v;
    const auto it = time_at.lower_bound(r.error_step);
    v.x = !vs_time
              ? static_cast<double>(r.error_step)
              : (it != time_at.end() ? it->second
                                     : (r.steps.empty() ? 0 : r.steps.back().time_s / time_div));
    v.label = "failed here";
    v.color = "#000";
    v.dash = "6 2";
    m.push_back(v);
  }
  return m;
}

// Stacked time split of one run: phase means per step, bucket-averaged to at most 600 points.
StackedChart TimeSplit(const RunLog& r, const std::string& id, const std::string& title) {
  StackedChart c;
  c.id = id;
  c.title = title;
  c.x.label = "step";
  c.y.label = "time per step (ms)";
  std::vector<const StepRecord*> rec;
  for (const StepRecord& st : r.steps) {
    if (AnyFinite({st.phase_ms.begin(), st.phase_ms.end()})) rec.push_back(&st);
  }
  // The first window holds the warm-up (plans, first allocations, caches): often ten times a
  // later step, it would flatten the rest. Left out when there are enough others.
  if (rec.size() >= 5) rec.erase(rec.begin());
  constexpr size_t kMax = 600;
  const size_t buckets = std::min(rec.size(), kMax);
  c.layers.resize(kPhases);
  for (int p = 0; p < kPhases; ++p) c.layers[static_cast<size_t>(p)].label = kPhaseLabels[p];
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * rec.size() / buckets, end = (b + 1) * rec.size() / buckets;
    double sx = 0;
    std::array<double, kPhases> sum{};
    for (size_t i = begin; i < end; ++i) {
      sx += static_cast<double>(rec[i]->step);
      for (int p = 0; p < kPhases; ++p) {
        const double v = rec[i]->phase_ms[static_cast<size_t>(p)];
        sum[static_cast<size_t>(p)] += std::isfinite(v) ? v : 0;
      }
    }
    const auto k = static_cast<double>(end - begin);
    c.x_values.push_back(sx / k);
    for (int p = 0; p < kPhases; ++p) {
      c.layers[static_cast<size_t>(p)].y.push_back(sum[static_cast<size_t>(p)] / k);
    }
  }
  // Evaluations and checkpoints make single windows many times longer than a step ("other"):
  // the axis ends a little above the usual total and says what it cut.
  std::vector<double> totals(c.x_values.size(), 0.0);
  for (const Layer& l : c.layers) {
    for (size_t i = 0; i < l.y.size(); ++i) totals[i] += l.y[i];
  }
  if (totals.size() >= 20) {
    std::vector<double> sorted = totals;
    std::sort(sorted.begin(), sorted.end());
    const double p95 = sorted[sorted.size() * 95 / 100], top = sorted.back();
    if (top > 3 * p95 && p95 > 0) {
      c.y.max = 2 * p95;
      c.title += fmt::format(" (peaks up to {} ms cut off)", TickLabel(top));
    }
  }
  return c;
}

}  // namespace

std::vector<Section> BuildCharts(const std::vector<const RunLog*>& runs) {
  const size_t n = runs.size();
  const std::vector<std::string> labels = RunLabels(runs);
  double max_time = 0;
  bool grad = false, scale = false, acc = false, evals = false;
  for (const RunLog* r : runs) {
    for (const StepRecord& st : r->steps) {
      if (std::isfinite(st.time_s)) max_time = std::max(max_time, st.time_s);
      grad = grad || std::isfinite(st.grad_norm);
      scale = scale || std::isfinite(st.loss_scale);
    }
    for (const EvalRecord& e : r->evals) {
      evals = true;
      acc = acc || std::isfinite(e.test_accuracy);
    }
  }
  const auto [tdiv, tunit] = TimeUnit(max_time);

  Section train{"Training", "", {}};
  LineChart loss{
      "loss-steps", "Training loss", {"step"}, {"training loss (mean per sample)"}, {}, {}};
  LineChart loss_t{"loss-time",
                   "Training loss against wall time",
                   {fmt::format("wall time ({})", tunit)},
                   {"training loss (mean per sample)"},
                   {},
                   {}};
  LineChart lr{"lr", "Learning rate", {"step"}, {"learning rate"}, {}, {}};
  LineChart sps{"throughput", "Throughput (all ranks)", {"step"}, {"samples/s"}, {}, {}};
  LineChart gn{"grad-norm", "Gradient norm", {"step"}, {"gradient L2 norm"}, {}, {}};
  LineChart ls{"loss-scale", "Loss scale (fp16)", {"step"}, {"loss scale"}, {}, {}};
  lr.y.from_zero = sps.y.from_zero = true;
  ls.y.log = true;
  double gmin = INFINITY, gmax = 0;
  for (size_t i = 0; i < n; ++i) {
    const RunLog& r = *runs[i];
    const Style st = StyleFor(static_cast<int>(i));
    AddRawAndSmoothed(StepSeries(r, [](const StepRecord& s) { return s.loss; }), st, labels[i], n,
                      &loss.curves);
    AddRawAndSmoothed(StepSeries(
                          r, [](const StepRecord& s) { return s.loss; }, true, tdiv),
                      st, labels[i], n, &loss_t.curves);
    for (const VMark& m : Marks(r, false, 1)) loss.marks.push_back(m);
    for (const VMark& m : Marks(r, true, tdiv)) loss_t.marks.push_back(m);
    auto simple = [&](LineChart* c, auto field) {
      Curve cv;
      cv.label = n == 1 ? "" : labels[i];
      cv.points = DownsampleMinMax(StepSeries(r, field), kMaxCurvePoints);
      cv.style = st;
      cv.width = 1.8;
      c->curves.push_back(std::move(cv));
    };
    simple(&lr, [](const StepRecord& s) { return s.lr; });
    simple(&sps, [](const StepRecord& s) { return s.samples_per_s; });
    if (grad) {
      simple(&gn, [](const StepRecord& s) { return s.grad_norm; });
      for (const StepRecord& s : r.steps) {
        if (std::isfinite(s.grad_norm) && s.grad_norm > 0) {
          gmin = std::min(gmin, s.grad_norm);
          gmax = std::max(gmax, s.grad_norm);
        }
      }
    }
    if (scale) {
      simple(&ls, [](const StepRecord& s) { return s.loss_scale; });
      for (const VMark& m : Marks(r, false, 1)) ls.marks.push_back(m);
    }
  }
  // A gradient norm that spans orders of magnitude (an early spike) reads better on a log axis.
  gn.y.log = gmax > 100 * gmin;
  train.charts.emplace_back(loss.id, RenderLineChart(loss));
  train.charts.emplace_back(loss_t.id, RenderLineChart(loss_t));
  train.charts.emplace_back(lr.id, RenderLineChart(lr));
  train.charts.emplace_back(sps.id, RenderLineChart(sps));
  if (grad) train.charts.emplace_back(gn.id, RenderLineChart(gn));
  if (scale) train.charts.emplace_back(ls.id, RenderLineChart(ls));
  std::vector<Section> out{std::move(train)};

  if (evals) {
    Section ev{"Evaluation", "On the whole test set, each sample counted once.", {}};
    LineChart ac{"test-accuracy", "Test accuracy", {"step"}, {"test accuracy (%)"}, {}, {}};
    LineChart tl{"test-loss", "Test loss", {"step"}, {"test loss (mean per sample)"}, {}, {}};
    for (size_t i = 0; i < n; ++i) {
      Curve a, l;
      a.label = l.label = labels[i];
      a.style = l.style = StyleFor(static_cast<int>(i));
      a.width = l.width = 1.5;
      a.markers = l.markers = true;
      for (const EvalRecord& e : runs[i]->evals) {
        a.points.Add(static_cast<double>(e.step), 100 * e.test_accuracy);
        l.points.Add(static_cast<double>(e.step), e.test_loss);
      }
      ac.curves.push_back(std::move(a));
      tl.curves.push_back(std::move(l));
    }
    if (acc) ev.charts.emplace_back(ac.id, RenderLineChart(ac));
    ev.charts.emplace_back(tl.id, RenderLineChart(tl));
    out.push_back(std::move(ev));
  }

  Section split{"Where the time goes",
                "Time per step by phase, mean over ranks per logging window: data wait is the "
                "loader; forward, backward and optimizer the maths; exposed communication the "
                "gradient allreduce and agreements not hidden behind backward; other the rest of "
                "the wall time (logging, evaluation, checkpoints). The first logging window "
                "(warm-up) is left out.",
                {}};
  Section ranks{"Ranks", "", {}};
  for (size_t i = 0; i < n; ++i) {
    const RunLog& r = *runs[i];
    const StackedChart ts =
        TimeSplit(r, RunId("time-split", i, n), RunTitle("Time per step by phase", labels[i], n));
    if (!ts.x_values.empty()) split.charts.emplace_back(ts.id, RenderStackedChart(ts));
    if (r.ranks.empty()) continue;
    BarChart bars;
    bars.id = RunId("rank-time", i, n);
    bars.title = RunTitle("Time per step by rank (number: data wait + compute)", labels[i], n);
    bars.value.label = "time per step (ms)";
    bars.segments = {"data wait", "compute (forward + backward + optimizer)",
                     "exposed communication"};
    bars.label_segments = 2;  // the number shown: the rank's own work
    double worst = -1;
    int64_t logged = 0;
    for (size_t k = 0; k < r.ranks.size(); ++k) {
      const RankTotals& t = r.ranks[k];
      const double m = static_cast<double>(std::max<int64_t>(t.records, 1));
      bars.categories.push_back(fmt::format("rank {}", k));
      bars.values.push_back({t.data_wait_ms / m, t.compute_ms / m, t.exposed_comm_ms / m});
      if ((t.data_wait_ms + t.compute_ms) / m > worst) {
        worst = (t.data_wait_ms + t.compute_ms) / m;
        bars.highlight = static_cast<int>(k);
      }
      logged = std::max(logged, t.records);
    }
    const RankTotals& slow = r.ranks[static_cast<size_t>(bars.highlight)];
    bars.highlight_note = "slowest";
    ranks.intro += fmt::format(
        "{}Slowest rank{}: rank {} (its data wait + compute is the largest; in {} of {} logging "
        "windows it was the slowest). The other ranks wait for it in exposed communication. ",
        ranks.intro.empty() ? "" : " ", n == 1 ? "" : " of " + labels[i], bars.highlight,
        slow.slowest_count, logged);
    ranks.charts.emplace_back(bars.id, RenderBarChart(bars));

    LineChart busy{RunId("rank-busy", i, n),
                   RunTitle("Work per step by rank (data wait + compute)", labels[i], n),
                   {"step"},
                   {"time per step (ms)"},
                   {},
                   {}};
    busy.y.from_zero = true;
    if (!r.ranks[0].busy_steps.empty()) {
      for (size_t k = 0; k < r.ranks.size(); ++k) {
        Curve cv;
        cv.label =
            fmt::format("rank {}{}", k, static_cast<int>(k) == bars.highlight ? " (slowest)" : "");
        Series busy_k{r.ranks[k].busy_steps, r.ranks[k].busy_ms};
        if (busy_k.size() >= 5) {  // without the warm-up window, as in the time split
          busy_k.x.erase(busy_k.x.begin());
          busy_k.y.erase(busy_k.y.begin());
        }
        cv.points = DownsampleMinMax(busy_k, kMaxCurvePoints);
        cv.style = StyleFor(static_cast<int>(k));
        cv.width = static_cast<int>(k) == bars.highlight ? 2.2 : 1.4;
        busy.curves.push_back(std::move(cv));
      }
    } else {
      Curve cv;
      cv.label = "mean over ranks (band: fastest to slowest)";
      cv.points = DownsampleMean(StepSeries(r, [](const StepRecord& s) { return s.busy_mean; }),
                                 kMaxCurvePoints);
      cv.band_low = DownsampleMean(StepSeries(r, [](const StepRecord& s) { return s.busy_min; }),
                                   kMaxCurvePoints);
      cv.band_high = DownsampleMean(StepSeries(r, [](const StepRecord& s) { return s.busy_max; }),
                                    kMaxCurvePoints);
      cv.style = StyleFor(0);
      if (cv.band_low.size() != cv.band_high.size()) cv.band_low = cv.band_high = Series{};
      busy.curves.push_back(std::move(cv));
    }
    ranks.charts.emplace_back(busy.id, RenderLineChart(busy));

    double mem_max = 0;
    for (const RankTotals& t : r.ranks) {
      if (std::isfinite(t.peak_mem_bytes)) mem_max = std::max(mem_max, t.peak_mem_bytes);
    }
    if (mem_max > 0) {
      const auto [mdiv, munit] = ByteUnit(mem_max);
      BarChart mem;
      mem.id = RunId("rank-memory", i, n);
      mem.title = RunTitle("Peak memory by rank", labels[i], n);
      mem.value.label = fmt::format("peak memory in use ({})", munit);
      mem.segments = {"peak device memory (caching allocator)"};
      for (size_t k = 0; k < r.ranks.size(); ++k) {
        mem.categories.push_back(fmt::format("rank {}", k));
        const double b = r.ranks[k].peak_mem_bytes;
        mem.values.push_back({std::isfinite(b) ? b / mdiv : 0});
      }
      ranks.charts.emplace_back(mem.id, RenderBarChart(mem));
    }
  }
  if (!split.charts.empty()) out.push_back(std::move(split));
  if (!ranks.charts.empty()) out.push_back(std::move(ranks));
  return out;
}

}  // namespace dptrain::report
