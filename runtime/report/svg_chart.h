// SPDX-License-Identifier: Apache-2.0
// Charts of `dptrain report` as standalone SVG: line charts (curves, markers, bands, vertical
// marks), stacked areas and horizontal stacked bars. Every style is an attribute (no CSS
// classes), so the same text is inlined in the HTML page and converted to PNG by rsvg-convert.
// Series are told apart by dash pattern and marker shape as well as colour, so a greyscale print
// keeps them apart.
#pragma once

#include <string>
#include <vector>

#include "runtime/report/series.h"

namespace dptrain::report {

// A look: colour, dash pattern, marker shape. Style(i) is the i-th of a fixed cycle.
struct Style {
  std::string color;
  std::string dash;  // SVG stroke-dasharray ("" = solid)
  int marker = 0;    // 0 circle, 1 square, 2 triangle, 3 diamond, 4 cross
};
Style StyleFor(int i);

struct Axis {
  std::string label;        // with the unit: "wall time (min)"
  bool log = false;         // base-10 logarithmic (positive values only)
  double min = 0, max = 0;  // min < max: fixed range; else from the data (y from 0 when >= 0)
  bool from_zero = false;   // y: include 0 in the automatic range
};

struct Curve {
  std::string label;  // legend text ("" = no legend entry)
  Series points;
  Style style;
  double width = 2;    // stroke width; 0 = markers only
  double opacity = 1;  // e.g. 0.35 for a raw series under its smoothed one
  bool markers = false;
  Series band_low;  // when set (same x as `points`): a filled band between it and `band_high`
  Series band_high;
};

struct VMark {
  double x = 0;
  std::string label;  // shown in a tooltip; the first mark of a label also in the legend
  std::string color = "#c00";
  std::string dash = "3 3";
};

struct LineChart {
  std::string id;  // file name for PNG output, element id in the page
  std::string title;
  Axis x, y;
  std::vector<Curve> curves;
  std::vector<VMark> marks;
};

// One layer of a stacked area: its values at the chart's x.
struct Layer {
  std::string label;
  std::vector<double> y;
};
struct StackedChart {
  std::string id, title;
  Axis x, y;  // y.max > 0: the axis ends there and higher peaks are cut off
  std::vector<double> x_values;
  std::vector<Layer> layers;  // bottom first
};

// Horizontal bars, one per category (rank), each split into segments.
struct BarChart {
  std::string id, title;
  Axis value;  // the horizontal axis
  std::vector<std::string> categories;
  std::vector<std::string> segments;        // legend, one per segment
  std::vector<std::vector<double>> values;  // [category][segment]
  int highlight = -1;                       // this category's label bold, marked "slowest"
  std::string highlight_note;
  // The number at a bar's end: the sum of its first `label_segments` segments (0: all).
  size_t label_segments = 0;
};

// Each returns one <svg> element (xmlns set, viewBox and width/height in px) with a <title>.
std::string RenderLineChart(const LineChart& c);
std::string RenderStackedChart(const StackedChart& c);
std::string RenderBarChart(const BarChart& c);

// Tick positions for [lo, hi]: about `target` "nice" values (1, 2, 5 x 10^k).
std::vector<double> NiceTicks(double lo, double hi, int target);
// A tick label: compact ("0.05", "1.5k", "2M", "1e-05").
std::string TickLabel(double v);
// Escapes &, <, >, " for XML text and attributes.
std::string XmlEscape(const std::string& s);

}  // namespace dptrain::report
