// SPDX-License-Identifier: Apache-2.0
// Curves for `dptrain report` (runtime/report/report.h): x/y series, their smoothing, and the
// downsampling that keeps a 100,000-step run's page small without hiding spikes.
#pragma once

#include <cstddef>
#include <vector>

namespace dptrain::report {

// A curve: y[i] at x[i], x non-decreasing. A non-finite y is a gap in the drawn line.
struct Series {
  std::vector<double> x, y;
  size_t size() const { return x.size(); }
  void Add(double xv, double yv) {
    x.push_back(xv);
    y.push_back(yv);
  }
};

// At most `max_points` points that keep every bucket's extremes: the series is cut into
// max_points / 2 buckets of consecutive points and each bucket keeps its minimum and its maximum
// (in x order), so a one-step spike stays visible. Shorter series are returned unchanged.
Series DownsampleMinMax(const Series& s, size_t max_points);

// Bucket means instead of extremes (for stacked areas, whose layers must still add up): at most
// `max_points` points, each the mean x and mean y of a bucket of consecutive points.
Series DownsampleMean(const Series& s, size_t max_points);

// Exponential moving average with bias correction (as TensorBoard's smoothing), weight chosen
// so that it averages over about `window` points; non-finite values are passed over.
Series Smooth(const Series& s, double window);

}  // namespace dptrain::report
