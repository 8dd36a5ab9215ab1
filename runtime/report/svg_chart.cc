// SPDX-License-Identifier: Apache-2.0
// SVG rendering of report charts (runtime/report/svg_chart.h). Coordinates are written with one
// decimal: a 640-pixel-wide chart needs no more, and it keeps long runs' pages small. One file
// past 400 lines: the three chart kinds share the scales, axes, legend and fills at its top.
#include "runtime/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace dptrain::report {
namespace {

constexpr double kWidth = 640;
constexpr double kLeft = 66, kRight = 18, kBottom = 46;
constexpr const char* kFont = "DejaVu Sans, Verdana, Arial, sans-serif";
constexpr const char* kInk = "#222";
constexpr const char* kGrid = "#e3e3e3";

// Colours of the Okabe-Ito palette (safe for colour blindness), ordered so that neighbours also
// differ in lightness; dashes and markers cycle with them.
const char* const kColors[] = {"#0072B2", "#D55E00", "#009E73", "#000000",
                               "#CC79A7", "#E69F00", "#56B4E9", "#999999"};
const char* const kDashes[] = {"", "7 4", "2 3", "9 3 2 3", "4 2", "1 2"};

// Fills of stacked layers and bar segments: colour plus a pattern on every other one, so that
// neighbours differ in greyscale too (0 solid, 1 diagonal lines, 2 dots, 3 cross-hatch).
struct Fill {
  const char* color;
  int pattern;
};
const Fill kFills[] = {{"#E69F00", 0}, {"#56B4E9", 1}, {"#0072B2", 0},
                       {"#D55E00", 3}, {"#009E73", 2}, {"#BBBBBB", 0}};

std::string F(double v) { return fmt::format("{:.1f}", v); }

// k * step without the float noise of the product (0.6000000000000001 -> 0.6).
double Clean(double v, double step) {
  if (std::fabs(v) < step * 1e-9) return 0;
  return std::stod(fmt::format("{:.12g}", v));
}

struct Scale {
  double d0 = 0, d1 = 1;  // data domain
  double p0 = 0, p1 = 1;  // pixels
  bool log = false;
  double operator()(double v) const {
    const double a = log ? std::log10(std::max(v, 1e-300)) : v;
    const double b0 = log ? std::log10(d0) : d0, b1 = log ? std::log10(d1) : d1;
    return p0 + (a - b0) / (b1 - b0) * (p1 - p0);
  }
};

// Domain and ticks for values in [lo, hi] (finite, lo <= hi).
void NiceDomain(double lo, double hi, bool log, bool exact, Scale* s, std::vector<double>* ticks) {
  s->log = log;
  if (log) {
    lo = std::max(lo, 1e-300);
    hi = std::max(hi, lo);
    double e0 = std::floor(std::log10(lo)), e1 = std::ceil(std::log10(hi));
    if (e1 <= e0) e1 = e0 + 1;
    s->d0 = std::pow(10.0, e0);
    s->d1 = std::pow(10.0, e1);
    const int every = std::max(1, static_cast<int>((e1 - e0) / 6) + 1);
    for (double e = e0; e <= e1; e += every) ticks->push_back(std::pow(10.0, e));
    return;
  }
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  *ticks = NiceTicks(lo, hi, 5);
  if (exact || ticks->size() < 2) {
    s->d0 = lo;
    s->d1 = hi;
    std::erase_if(*ticks,
                  [&](double t) { return t < lo - 1e-9 * (hi - lo) || t > hi + 1e-9 * (hi - lo); });
    return;
  }
  const double step = (*ticks)[1] - (*ticks)[0];
  s->d0 = std::floor(lo / step + 1e-9) * step;
  s->d1 = std::ceil(hi / step - 1e-9) * step;
  ticks->clear();
  for (double k = std::round(s->d0 / step); k * step <= s->d1 + step * 1e-6; k += 1) {
    ticks->push_back(Clean(k * step, step));
  }
}

std::string MarkerPath(int shape, double x, double y) {
  constexpr double r = 4;
  switch (shape % 5) {
    case 1:
      return fmt::format("M{} {}h{}v{}h{}z", F(x - r), F(y - r), F(2 * r), F(2 * r), F(-2 * r));
    case 2:
      return fmt::format("M{} {}L{} {}L{} {}z", F(x), F(y - r * 1.2), F(x + r * 1.1),
                         F(y + r * 0.8), F(x - r * 1.1), F(y + r * 0.8));
    case 3:
      return fmt::format("M{} {}L{} {}L{} {}L{} {}z", F(x), F(y - r * 1.3), F(x + r), F(y), F(x),
                         F(y + r * 1.3), F(x - r), F(y));
    case 4:
      return fmt::format("M{} {}L{} {}M{} {}L{} {}", F(x - r), F(y - r), F(x + r), F(y + r),
                         F(x - r), F(y + r), F(x + r), F(y - r));
    default:
      return fmt::format("M{} {}a{} {} 0 1 0 {} 0a{} {} 0 1 0 {} 0z", F(x - r), F(y), F(r), F(r),
                         F(2 * r), F(r), F(r), F(-2 * r));
  }
}

std::string MarkerSvg(const Style& s, double x, double y, const std::string& tip) {
  const bool stroke_only = s.marker % 5 == 4;
  return fmt::format("<path d=\"{}\" fill=\"{}\" stroke=\"{}\" stroke-width=\"{}\">{}</path>",
                     MarkerPath(s.marker, x, y), stroke_only ? "none" : s.color,
                     stroke_only ? s.color : "#fff", stroke_only ? 2 : 1,
                     tip.empty() ? "" : "<title>" + XmlEscape(tip) + "</title>");
}

std::string PatternDefs(const std::string& id) {
  std::string out = "<defs>";
  for (size_t i = 0; i < std::size(kFills); ++i) {
    const Fill& f = kFills[i];
    if (f.pattern == 0) continue;
    out += fmt::format(
        "<pattern id=\"{}-f{}\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\"{}>"
        "<rect width=\"6\" height=\"6\" fill=\"{}\"/>",
        id, i, f.pattern == 1 ? " patternTransform=\"rotate(45)\"" : "", f.color);
    if (f.pattern == 1) {
      out += "<rect width=\"2\" height=\"6\" fill=\"#fff\" fill-opacity=\"0.8\"/>";
    } else if (f.pattern == 2) {
      out += "<circle cx=\"3\" cy=\"3\" r=\"1.3\" fill=\"#fff\"/>";
    } else {
      out += "<path d=\"M0 0L6 6M6 0L0 6\" stroke=\"#fff\" stroke-width=\"1.2\"/>";
    }
    out += "</pattern>";
  }
  return out + "</defs>";
}

std::string FillOf(const std::string& id, size_t i) {
  const size_t k = i % std::size(kFills);
  return kFills[k].pattern == 0 ? std::string(kFills[k].color) : fmt::format("url(#{}-f{})", id, k);
}

// Legend entries laid out left to right under the title, wrapping; returns the SVG and sets
// the height used.
struct LegendEntry {
  std::string label;
  std::string swatch;  // SVG drawn in a 26x12 box at (0, -9) relative to the entry's origin
};
std::string Legend(const std::vector<LegendEntry>& entries, double top, double* height) {
  std::string out;
  double x = kLeft, y = top + 12;
  int rows = entries.empty() ? 0 : 1;
  for (const auto& e : entries) {
    const double w = 34 + 6.8 * static_cast<double>(e.label.size());
    if (x + w > kWidth - kRight && x > kLeft) {
      x = kLeft;
      y += 17;
      ++rows;
    }
    out += fmt::format("<g transform=\"translate({} {})\">{}<text x=\"30\" y=\"0\">{}</text></g>",
                       F(x), F(y), e.swatch, XmlEscape(e.label));
    x += w + 12;
  }
  *height = rows * 17.0;
  return out;
}

std::string LineSwatch(const Curve& c) {
  std::string s;
  if (c.band_low.size() > 0) {
    s += fmt::format(
        "<rect x=\"0\" y=\"-9\" width=\"26\" height=\"10\" fill=\"{}\" "
        "fill-opacity=\"0.25\"/>",
        c.style.color);
  }
  if (c.width > 0) {
    s += fmt::format(
        "<line x1=\"0\" y1=\"-4\" x2=\"26\" y2=\"-4\" stroke=\"{}\" stroke-width=\"{}\"{}{}/>",
        c.style.color, std::max(c.width, 1.5),
        c.style.dash.empty() ? "" : " stroke-dasharray=\"" + c.style.dash + "\"",
        c.opacity < 1 ? fmt::format(" stroke-opacity=\"{}\"", std::max(c.opacity, 0.5)) : "");
  }
  if (c.markers) s += MarkerSvg(c.style, 13, -4, "");
  return s;
}

// "M x y L x y ..." over runs of finite points.
std::string PathOf(const Series& s, const Scale& sx, const Scale& sy) {
  std::string d;
  bool pen = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!std::isfinite(s.y[i]) || !std::isfinite(s.x[i]) || (sy.log && s.y[i] <= 0)) {
      pen = false;
      continue;
    }
    d += fmt::format("{}{} {}", pen ? "L" : "M", F(sx(s.x[i])), F(sy(s.y[i])));
    pen = true;
  }
  return d;
}

std::string Header(const std::string& id, const std::string& title, double height, const Scale* sx,
                   const Scale* sy) {
  std::string data;
  if (sx != nullptr && sy != nullptr) {
    data = fmt::format(
        " data-px0=\"{}\" data-px1=\"{}\" data-py0=\"{}\" data-py1=\"{}\" data-x0=\"{}\" "
        "data-x1=\"{}\" data-y0=\"{}\" data-y1=\"{}\" data-ylog=\"{}\"",
        F(sx->p0), F(sx->p1), F(sy->p0), F(sy->p1), sx->d0, sx->d1, sy->d0, sy->d1,
        sy->log ? 1 : 0);
  }
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"{}\" class=\"chart\" width=\"{}\" "
      "height=\"{}\" viewBox=\"0 0 {} {}\" font-family=\"{}\" font-size=\"12\" fill=\"{}\"{}>"
      "<title>{}</title><rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>"
      "<text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>",
      id, kWidth, F(height), kWidth, F(height), kFont, kInk, data, XmlEscape(title), kLeft - 56,
      XmlEscape(title));
}

// Grid, ticks and axis labels of a plot area.
std::string Axes(const Scale& sx, const std::vector<double>& xt, const Axis& xa, const Scale& sy,
                 const std::vector<double>& yt, const Axis& ya) {
  std::string out;
  for (double t : yt) {
    const double y = sy(t);
    out += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
        F(sx.p0), F(y), F(sx.p1), F(y), kGrid, F(sx.p0 - 6), F(y + 4), TickLabel(t));
  }
  for (double t : xt) {
    const double x = sx(t);
    out += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        F(x), F(sy.p1), F(x), F(sy.p0), kGrid, F(x), F(sy.p0 + 16), TickLabel(t));
  }
  out += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>",
      F(sx.p0), F(sy.p1), F(sx.p1 - sx.p0), F(sy.p0 - sy.p1));
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                     F((sx.p0 + sx.p1) / 2), F(sy.p0 + 36), XmlEscape(xa.label));
  const double cy = (sy.p0 + sy.p1) / 2;
  out += fmt::format(
      "<text x=\"14\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {})\">{}</text>",
      F(cy), F(cy), XmlEscape(ya.label));
  return out;
}

void Extend(const Series& s, bool xs, bool log, double* lo, double* hi) {
  const auto& v = xs ? s.x : s.y;
  for (double a : v) {
    if (!std::isfinite(a) || (log && a <= 0)) continue;
    *lo = std::min(*lo, a);
    *hi = std::max(*hi, a);
  }
}

}  // namespace

Style StyleFor(int i) {
  const int n = static_cast<int>(std::size(kColors));
  Style s;
  s.color = kColors[i % n];
  s.dash = kDashes[i % static_cast<int>(std::size(kDashes))];
  s.marker = i % 5;
  return s;
}

std::vector<double> NiceTicks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!(hi > lo) || target < 1) return t;
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  const double first = std::ceil(lo / step - 1e-9);
  for (double k = first; k * step <= hi + step * 1e-9; k += 1) {
    t.push_back(Clean(k * step, step));
  }
  return t;
}

std::string TickLabel(double v) {
  const double a = std::fabs(v);
  if (v == 0) return "0";
  if (a >= 1e9) return fmt::format("{:g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:g}k", v / 1e3);
  if (a < 1e-3) return fmt::format("{:.0e}", v);
  return fmt::format("{:.4g}", v);
}

std::string XmlEscape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string RenderLineChart(const LineChart& c) {
  std::vector<LegendEntry> entries;
  for (const Curve& cv : c.curves) {
    if (!cv.label.empty()) entries.push_back({cv.label, LineSwatch(cv)});
  }
  std::map<std::string, const VMark*> mark_labels;
  for (const VMark& m : c.marks) {
    if (mark_labels.emplace(m.label, &m).second) {
      entries.push_back({m.label, fmt::format("<line x1=\"13\" y1=\"-11\" x2=\"13\" y2=\"3\" "
                                              "stroke=\"{}\" stroke-width=\"1.5\" "
                                              "stroke-dasharray=\"{}\"/>",
                                              m.color, m.dash)});
    }
  }
  double legend_h = 0;
  const std::string legend = Legend(entries, 26, &legend_h);
  const double top = 34 + legend_h, plot_h = 220;
  const double height = top + plot_h + kBottom;

  double x0 = c.x.min, x1 = c.x.max;
  if (!(x0 < x1)) {
    x0 = INFINITY;
    x1 = -INFINITY;
    for (const Curve& cv : c.curves) Extend(cv.points, true, false, &x0, &x1);
    if (!(x0 <= x1)) x0 = 0, x1 = 1;
  }
  double y0 = c.y.min, y1 = c.y.max;
  if (!(y0 < y1)) {
    y0 = INFINITY;
    y1 = -INFINITY;
    for (const Curve& cv : c.curves) {
      Extend(cv.points, false, c.y.log, &y0, &y1);
      Extend(cv.band_low, false, c.y.log, &y0, &y1);
      Extend(cv.band_high, false, c.y.log, &y0, &y1);
    }
    if (!(y0 <= y1)) y0 = 0, y1 = 1;
    if (c.y.from_zero && !c.y.log) y0 = std::min(y0, 0.0);
  }
  Scale sx{0, 1, kLeft, kWidth - kRight, c.x.log}, sy{0, 1, top + plot_h, top, c.y.log};
  std::vector<double> xt, yt;
  NiceDomain(x0, x1, c.x.log, true, &sx, &xt);
  NiceDomain(y0, y1, c.y.log, false, &sy, &yt);

  std::string out = Header(c.id, c.title, height, &sx, &sy);
  out += legend;
  out += Axes(sx, xt, c.x, sy, yt, c.y);
  out += fmt::format(
      "<clipPath id=\"{}-clip\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath>"
      "<g clip-path=\"url(#{}-clip)\">",
      c.id, F(sx.p0), F(sy.p1 - 6), F(sx.p1 - sx.p0 + 6), F(sy.p0 - sy.p1 + 12), c.id);
  size_t drawn_marks = 0;
  for (const VMark& m : c.marks) {
    if (++drawn_marks > 500) break;  // a run that skips thousands of steps: the first 500
    const double x = sx(m.x);
    out += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"1.5\" "
        "stroke-dasharray=\"{}\"><title>{}</title></line>",
        F(x), F(sy.p1), F(x), F(sy.p0), m.color, m.dash, XmlEscape(m.label));
  }
  for (const Curve& cv : c.curves) {
    if (cv.band_low.size() > 0 && cv.band_low.size() == cv.band_high.size()) {
      Series outline = cv.band_high;
      for (size_t i = cv.band_low.size(); i-- > 0;) outline.Add(cv.band_low.x[i], cv.band_low.y[i]);
      out += fmt::format("<path d=\"{}z\" fill=\"{}\" fill-opacity=\"0.22\" stroke=\"none\"/>",
                         PathOf(outline, sx, sy), cv.style.color);
    }
    if (cv.width > 0) {
      out += fmt::format(
          "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" stroke-linejoin=\"round\""
          "{}{}/>",
          PathOf(cv.points, sx, sy), cv.style.color, cv.width,
          cv.style.dash.empty() ? "" : " stroke-dasharray=\"" + cv.style.dash + "\"",
          cv.opacity < 1 ? fmt::format(" stroke-opacity=\"{}\"", cv.opacity) : "");
    }
    if (cv.markers) {
      const bool tips = cv.points.size() <= 300;
      for (size_t i = 0; i < cv.points.size(); ++i) {
        if (!std::isfinite(cv.points.y[i])) continue;
        out += MarkerSvg(cv.style, sx(cv.points.x[i]), sy(cv.points.y[i]),
                         tips ? fmt::format("{}: {} at {} {}", cv.label, TickLabel(cv.points.y[i]),
                                            c.x.label, TickLabel(cv.points.x[i]))
                              : "");
      }
    }
  }
  return out + "</g></svg>";
}

std::string RenderStackedChart(const StackedChart& c) {
  std::vector<LegendEntry> entries;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    entries.push_back({c.layers[i].label,
                       fmt::format("<rect x=\"0\" y=\"-10\" width=\"24\" height=\"12\" fill=\"{}\" "
                                   "stroke=\"#555\" stroke-width=\"0.5\"/>",
                                   FillOf(c.id, i))});
  }
  double legend_h = 0;
  const std::string legend = Legend(entries, 26, &legend_h);
  const double top = 34 + legend_h, plot_h = 220;
  const double height = top + plot_h + kBottom;
  const size_t n = c.x_values.size();
  std::vector<double> base(n, 0.0);
  std::vector<std::vector<double>> tops;
  double ymax = 0;
  for (const Layer& l : c.layers) {
    for (size_t i = 0; i < n; ++i) {
      const double v = i < l.y.size() && std::isfinite(l.y[i]) ? std::max(l.y[i], 0.0) : 0;
      base[i] += v;
      ymax = std::max(ymax, base[i]);
    }
    tops.push_back(base);
  }
  double x0 = n > 0 ? c.x_values.front() : 0, x1 = n > 0 ? c.x_values.back() : 1;
  if (!(x0 < x1)) x1 = x0 + 1;
  Scale sx{0, 1, kLeft, kWidth - kRight, false}, sy{0, 1, top + plot_h, top, false};
  std::vector<double> xt, yt;
  NiceDomain(x0, x1, false, true, &sx, &xt);
  const double ytop = c.y.max > 0 ? std::min(c.y.max, ymax) : ymax;
  NiceDomain(0, ytop > 0 ? ytop : 1, false, false, &sy, &yt);
  std::string out = Header(c.id, c.title, height, &sx, &sy);
  out += PatternDefs(c.id) + legend;
  out += Axes(sx, xt, c.x, sy, yt, c.y);
  out += fmt::format(
      "<clipPath id=\"{}-clip\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath>"
      "<g clip-path=\"url(#{}-clip)\">",
      c.id, F(sx.p0), F(sy.p1), F(sx.p1 - sx.p0), F(sy.p0 - sy.p1), c.id);
  for (size_t k = 0; k < tops.size(); ++k) {
    std::string d;
    for (size_t i = 0; i < n; ++i) {
      d += fmt::format("{}{} {}", i == 0 ? "M" : "L", F(sx(c.x_values[i])), F(sy(tops[k][i])));
    }
    for (size_t i = n; i-- > 0;) {
      const double below = k == 0 ? 0 : tops[k - 1][i];
      d += fmt::format("L{} {}", F(sx(c.x_values[i])), F(sy(below)));
    }
    if (n > 0) {
      out += fmt::format(
          "<path d=\"{}z\" fill=\"{}\" stroke=\"#444\" stroke-width=\"0.4\"><title>{}</title>"
          "</path>",
          d, FillOf(c.id, k), XmlEscape(c.layers[k].label));
    }
  }
  return out + "</g></svg>";
}

std::string RenderBarChart(const BarChart& c) {
  std::vector<LegendEntry> entries;
  for (size_t i = 0; i < c.segments.size(); ++i) {
    entries.push_back({c.segments[i],
                       fmt::format("<rect x=\"0\" y=\"-10\" width=\"24\" height=\"12\" fill=\"{}\" "
                                   "stroke=\"#555\" stroke-width=\"0.5\"/>",
                                   FillOf(c.id, i))});
  }
  double legend_h = 0;
  const std::string legend = Legend(entries, 26, &legend_h);
  const double row = c.categories.size() > 16 ? 12 : 22;
  const double top = 40 + legend_h;
  const double plot_h = row * static_cast<double>(std::max<size_t>(c.categories.size(), 1));
  const double height = top + plot_h + kBottom;
  double vmax = 0;
  for (const auto& v : c.values) {
    double sum = 0;
    for (double a : v) sum += std::isfinite(a) ? std::max(a, 0.0) : 0;
    vmax = std::max(vmax, sum);
  }
  Scale sx{0, 1, kLeft, kWidth - kRight - 90, false}, sy{0, 1, top + plot_h, top, false};
  std::vector<double> xt;
  NiceDomain(0, vmax > 0 ? vmax : 1, false, false, &sx, &xt);
  sy.d0 = 0;
  sy.d1 = 1;
  std::string out = Header(c.id, c.title, height, nullptr, nullptr);
  out += PatternDefs(c.id) + legend;
  Axis none;
  out += Axes(sx, xt, c.value, sy, {}, none);
  for (size_t r = 0; r < c.categories.size(); ++r) {
    const double y = top + row * static_cast<double>(r);
    const bool hl = static_cast<int>(r) == c.highlight;
    const bool label = c.categories.size() <= 32 || hl || r % 4 == 0;
    if (label) {
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\"{}>{}</text>", F(kLeft - 6),
                         F(y + row / 2 + 4), hl ? " font-weight=\"bold\"" : "",
                         XmlEscape(c.categories[r]));
    }
    double x = 0, labelled = 0;
    std::string tip = c.categories[r];
    for (size_t s = 0; s < c.values[r].size(); ++s) {
      const double v = std::isfinite(c.values[r][s]) ? std::max(c.values[r][s], 0.0) : 0;
      out += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#444\" "
          "stroke-width=\"0.4\"/>",
          F(sx(x)), F(y + 2), F(sx(x + v) - sx(x)), F(row - 4), FillOf(c.id, s));
      tip += fmt::format("; {} {}", s < c.segments.size() ? c.segments[s] : "", TickLabel(v));
      x += v;
      if (c.label_segments == 0 || s < c.label_segments) labelled += v;
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\"{}>{}{}<title>{}</title></text>", F(sx(x) + 5),
                       F(y + row / 2 + 4), hl ? " font-weight=\"bold\"" : "", TickLabel(labelled),
                       hl && !c.highlight_note.empty() ? " ◀ " + XmlEscape(c.highlight_note) : "",
                       XmlEscape(tip));
  }
  return out + "</svg>";
}

}  // namespace dptrain::report
