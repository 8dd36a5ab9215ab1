// SPDX-License-Identifier: Apache-2.0
// `dptrain report` without a browser: reading metrics.jsonl tolerantly (cut last line, older
// and newer records), downsampling that keeps spikes, the SVG charts, and the page (size of a
// 100,000-step run, only the differing keys for several runs, a failed run's error).
#include "runtime/report/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "runtime/report/svg_chart.h"
#include "tests/testing/temp_dir.h"

namespace dptrain::report {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A step record as dptrain train writes it (docs/design.md section 5), `world` ranks.
nlohmann::json StepLine(int64_t step, int world, double loss) {
  std::vector<double> data(static_cast<size_t>(world), 0.5), compute(data), comm(data), peak(data);
  for (int r = 0; r < world; ++r) {
    compute[static_cast<size_t>(r)] = 3.0 + r;  // the last rank is the slowest
    peak[static_cast<size_t>(r)] = 1e6 * (r + 1);
  }
  return {{"kind", "step"},
          {"step", step},
          {"epoch", 1},
          {"time_s", 0.01 * static_cast<double>(step)},
          {"loss", loss},
          {"lr", 0.05},
          {"samples_per_s", 5000.0},
          {"grad_norm", 1.5},
          {"peak_mem_bytes", {{"min", 1e6}, {"mean", 1.5e6}, {"max", 1e6 * world}}},
          {"phase_ms",
           {{"data_wait", 0.5},
            {"forward", 1.0},
            {"backward", 2.0},
            {"exposed_comm", 0.7},
            {"optimizer", 0.3},
            {"other", 0.1}}},
          {"slowest_rank", world - 1},
          {"rank_ms", {{"data_wait", data}, {"compute", compute}, {"exposed_comm", comm}}},
          {"rank_peak_mem_bytes", peak}};
}

nlohmann::json StartLine(int world) {
  return {{"kind", "start"},
          {"step", 0},
          {"epoch", 1},
          {"time_s", 0},
          {"version", "0.1.0"},
          {"model", "ref_cnn"},
          {"params", 421642},
          {"world_size", world},
          {"hosts", 1},
          {"devices", std::vector<std::string>(static_cast<size_t>(world), "vm cpu")},
          {"threads", 1},
          {"global_batch", 64},
          {"micro_batch", 32},
          {"accumulate", 1},
          {"precision", "fp32"},
          {"optimizer", "sgd"},
          {"train_samples", 60000},
          {"test_samples", 10000},
          {"steps_per_epoch", 937},
          {"total_steps", 4685}};
}

TEST(ReportSeriesTest, DownsampleKeepsSpikesAndBoundsPoints) {
  Series s;
  for (int i = 0; i < 100000; ++i) s.Add(i, i == 54321 ? 100.0 : (i == 777 ? -5.0 : 1.0));
  const Series d = DownsampleMinMax(s, 1000);
  EXPECT_LE(d.size(), 1000u);
  EXPECT_THAT(d.y, Contains(100.0));
  EXPECT_THAT(d.y, Contains(-5.0));
  for (size_t i = 1; i < d.size(); ++i) ASSERT_LE(d.x[i - 1], d.x[i]) << "x order at " << i;
  Series small;
  small.Add(1, 2);
  EXPECT_EQ(DownsampleMinMax(small, 1000).size(), 1u);
  EXPECT_LE(DownsampleMean(s, 500).size(), 500u);
}

TEST(ReportSeriesTest, SmoothingOfAConstantIsTheConstantAndSkipsNaN) {
  Series s;
  for (int i = 0; i < 50; ++i) s.Add(i, i == 10 ? kNaN : 3.0);
  const Series m = Smooth(s, 10);
  for (double y : m.y) EXPECT_NEAR(y, 3.0, 1e-12);
}

TEST(ReportParseTest, CutLastLineUnknownKindsAndOldLinesAreNotedNotFatal) {
  RunLog run;
  std::string text = StartLine(2).dump() + "\n";
  text +=
      R"({"kind":"step","step":50,"epoch":1,"time_s":1.0,"loss":2.0,"lr":0.05,"samples_per_s":900})"
      "\n";  // an older dptrain: no phase split, no ranks
  text += StepLine(100, 2, 1.5).dump() + "\n";
  text += "this is not json\n";
  text += R"({"kind":"telemetry","step":100})"
          "\n";
  text += R"({"kind":"eval","step":100,"epoch":1,"time_s":2,"test_loss":0.5,"test_accuracy":0.8})"
          "\n";
  text += R"({"kind":"step","step":150,"ep)";  // cut mid-write
  ParseMetrics(text, &run);
  EXPECT_EQ(run.steps.size(), 2u);
  EXPECT_EQ(run.evals.size(), 1u);
  EXPECT_EQ(run.world_size, 2);
  EXPECT_EQ(run.last_step, 100);
  ASSERT_EQ(run.ranks.size(), 2u);
  EXPECT_EQ(run.ranks[1].slowest_count, 1);
  EXPECT_TRUE(std::isnan(run.steps[0].phase_ms[kForward]));
  EXPECT_DOUBLE_EQ(run.steps[1].phase_ms[kForward], 1.0);
  EXPECT_DOUBLE_EQ(run.steps[1].busy_max, 4.5);
  const std::string notes = ::testing::PrintToString(run.notes);
  EXPECT_THAT(notes, HasSubstr("line 7: the last line is incomplete"));
  EXPECT_THAT(notes, HasSubstr("line 4: not a JSON object"));
  EXPECT_THAT(notes, HasSubstr("unknown kind \\\"telemetry\\\""));
  EXPECT_THAT(notes, HasSubstr("1 of 2 step records have no time split"));
}

TEST(ReportParseTest, ConfigTomlFlattensSectionsAndMultiLineArrays) {
  const auto kv = ParseConfigToml(
      "# c\nrun_dir = \"runs/x\"\n\n[train]\nlr = 0.05\n[model]\nlayers = [\n  { type = "
      "\"relu\" },\n]\nclasses = 10\n");
  ASSERT_EQ(kv.size(), 4u);
  EXPECT_EQ(kv[0], std::make_pair(std::string("run_dir"), std::string("\"runs/x\"")));
  EXPECT_EQ(kv[1].first, "train.lr");
  EXPECT_EQ(kv[2].first, "model.layers");
  EXPECT_THAT(kv[2].second, HasSubstr("relu"));
  EXPECT_EQ(kv[3], std::make_pair(std::string("model.classes"), std::string("10")));
}

TEST(ReportReadTest, MissingDirectoryEmptyFileAndLoggedError) {
  testing::TempDir tmp;
  const RunLog missing = ReadRun(tmp.File("nope"));
  EXPECT_FALSE(missing.exists);
  EXPECT_THAT(::testing::PrintToString(missing.notes), HasSubstr("no such directory"));

  std::ofstream(tmp.File("metrics.jsonl")).close();
  std::ofstream(tmp.File("job.err")) << "starting\ndptrain: error: [rank 1/2 vm] boom\n";
  const RunLog empty = ReadRun(tmp.path());
  EXPECT_TRUE(empty.has_metrics);
  EXPECT_EQ(empty.used, 0);
  EXPECT_THAT(::testing::PrintToString(empty.notes), HasSubstr("is empty"));
  EXPECT_EQ(empty.error, "[rank 1/2 vm] boom");
  EXPECT_EQ(empty.error_source, "job.err");
}

std::string WriteRun(const testing::TempDir& tmp, const std::string& name, int64_t steps, int world,
                     const std::string& lr, bool finished) {
  const std::string dir = tmp.File(name);
  std::filesystem::create_directories(dir);
  std::ofstream m(dir + "/metrics.jsonl");
  m << StartLine(world).dump() << "\n";
  // One record changed in place: building a fresh one per step costs ~50 allocations, which
  // under ASan (fast_unwind_on_malloc=0, scripts/sanitize.sh) made this test take minutes.
  nlohmann::json line = StepLine(1, world, 2.0);
  for (int64_t s = 1; s <= steps; ++s) {
    line["step"] = s;
    line["time_s"] = 0.01 * static_cast<double>(s);
    line["loss"] = 2.0 / std::sqrt(static_cast<double>(s));
    m << line.dump() << "\n";
    if (s % 1000 == 0) {
      m << nlohmann::json{{"kind", "eval"},    {"step", s},
                          {"epoch", s / 1000}, {"time_s", 0.01 * static_cast<double>(s)},
                          {"test_loss", 0.4},  {"test_accuracy", 0.9}}
               .dump()
        << "\n";
    }
  }
  if (finished) {
    m << R"({"kind":"summary","step":)" << steps
      << R"(,"time_s":99.0,"samples_per_s":5000,"status":"finished"})"
      << "\n";
  } else {
    m << R"({"kind":"error","step":)" << steps
      << R"(,"time_s":9.0,"exit_code":3,"message":"the training loss is nan at step 7"})"
      << "\n";
  }
  std::ofstream(dir + "/config.toml")
      << "run_dir = \"" << dir << "\"\nseed = 1\n[train]\nlr = " << lr << "\nepochs = 5\n";
  return dir;
}

TEST(ReportPageTest, AHundredThousandStepRunStaysUnderTwoMegabytes) {
  testing::TempDir tmp;
  const std::string dir = WriteRun(tmp, "long", 100000, 4, "0.05", true);
  const Report rep = BuildReport({ReadRun(dir)});
  EXPECT_LT(rep.html.size(), 2u << 20) << "bytes: " << rep.html.size();
  EXPECT_TRUE(rep.notes.empty()) << ::testing::PrintToString(rep.notes);
  EXPECT_EQ(Count(rep.html, "<svg "), rep.charts.size());
  EXPECT_EQ(Count(rep.html, "</svg>"), rep.charts.size());
  EXPECT_GE(rep.charts.size(), 10u);
  // Self-contained: nothing loaded from elsewhere.
  EXPECT_THAT(rep.html, Not(HasSubstr(" src=")));
  EXPECT_THAT(rep.html, Not(HasSubstr("href=")));
  EXPECT_THAT(rep.html, Not(HasSubstr("url(http")));
  EXPECT_THAT(rep.html, AllOf(HasSubstr("data-key=\"steps\""), HasSubstr(">100000<"),
                              HasSubstr("0.9000 (90.00%)"), HasSubstr("rank 3 (its data wait")));
}

TEST(ReportPageTest, SeveralRunsOverlayAndTheTableShowsOnlyDifferingKeys) {
  testing::TempDir tmp;
  const std::string a = WriteRun(tmp, "a", 300, 2, "0.05", true);
  const std::string b = WriteRun(tmp, "b", 300, 2, "0.1", true);
  const Report rep = BuildReport({ReadRun(a), ReadRun(b), ReadRun(tmp.File("gone"))});
  const std::string shown = rep.html.substr(0, rep.html.find("<details>"));
  EXPECT_THAT(shown, HasSubstr("data-key=\"config.train.lr\""));
  EXPECT_THAT(shown, Not(HasSubstr("data-key=\"config.train.epochs\"")));
  EXPECT_THAT(shown, Not(HasSubstr("data-key=\"model\"")));
  EXPECT_THAT(rep.html, HasSubstr("keys, equal in every run"));
  EXPECT_THAT(::testing::PrintToString(rep.notes), HasSubstr("no such directory"));
  // Both runs in the loss chart's legend; per-run charts for each.
  EXPECT_THAT(rep.html, AllOf(HasSubstr("id=\"time-split-1\""), HasSubstr("id=\"time-split-2\"")));
}

TEST(ReportPageTest, AFailedRunShowsItsErrorAndWhereItStopped) {
  testing::TempDir tmp;
  const std::string dir = WriteRun(tmp, "bad", 7, 1, "0.05", false);
  const Report rep = BuildReport({ReadRun(dir)});
  EXPECT_THAT(rep.html,
              AllOf(HasSubstr("failed after step 7 (exit 3)"),
                    HasSubstr("the training loss is nan at step 7"), HasSubstr("failed here")));
}

TEST(ReportSvgTest, LinesBreakAtGapsAndAxesCarryTheirLabels) {
  LineChart c;
  c.id = "t";
  c.title = "T <1>";
  c.x.label = "step";
  c.y.label = "loss (mean per sample)";
  Curve cv;
  cv.label = "a";
  cv.points.Add(0, 1);
  cv.points.Add(1, 2);
  cv.points.Add(2, kNaN);
  cv.points.Add(3, 1);
  cv.points.Add(4, 3);
  c.curves.push_back(cv);
  const std::string svg = RenderLineChart(c);
  EXPECT_THAT(svg, AllOf(HasSubstr(">step<"), HasSubstr(">loss (mean per sample)<"),
                         HasSubstr("T &lt;1&gt;"), HasSubstr("xmlns=")));
  const std::regex path("<path d=\"(M[^\"]*)\" fill=\"none\"");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, path));
  EXPECT_EQ(Count(m[1].str(), "M"), 2u) << m[1].str();
}

TEST(ReportSvgTest, NiceTicksAndLabels) {
  EXPECT_EQ(NiceTicks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_EQ(NiceTicks(0, 100000, 5).back(), 100000);
  EXPECT_EQ(TickLabel(25000), "25k");
  EXPECT_EQ(TickLabel(0.05), "0.05");
  EXPECT_EQ(TickLabel(0), "0");
}

}  // namespace
}  // namespace dptrain::report
