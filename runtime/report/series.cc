// SPDX-License-Identifier: Apache-2.0
// Downsampling and smoothing of report curves (runtime/report/series.h).
#include "runtime/report/series.h"

#include <algorithm>
#include <cmath>

namespace dptrain::report {

Series DownsampleMinMax(const Series& s, size_t max_points) {
  if (s.size() <= max_points || max_points < 2) return s;
  const size_t buckets = max_points / 2;
  Series out;
  out.x.reserve(max_points);
  out.y.reserve(max_points);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * s.size() / buckets;
    const size_t end = (b + 1) * s.size() / buckets;
    size_t lo = end, hi = end;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(s.y[i])) continue;
      if (lo == end || s.y[i] < s.y[lo]) lo = i;
      if (hi == end || s.y[i] > s.y[hi]) hi = i;
    }
    if (lo == end) {  // a bucket with no finite value stays a gap
      out.Add(s.x[begin], s.y[begin]);
      continue;
    }
    const size_t first = std::min(lo, hi), second = std::max(lo, hi);
    out.Add(s.x[first], s.y[first]);
    if (second != first) out.Add(s.x[second], s.y[second]);
  }
  return out;
}

Series DownsampleMean(const Series& s, size_t max_points) {
  if (s.size() <= max_points || max_points < 1) return s;
  Series out;
  for (size_t b = 0; b < max_points; ++b) {
    const size_t begin = b * s.size() / max_points;
    const size_t end = (b + 1) * s.size() / max_points;
    double sx = 0, sy = 0;
    size_t n = 0;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(s.y[i])) continue;
      sx += s.x[i];
      sy += s.y[i];
      ++n;
    }
    if (n > 0) out.Add(sx / static_cast<double>(n), sy / static_cast<double>(n));
  }
  return out;
}

Series Smooth(const Series& s, double window) {
  // Weight w: a point's influence decays to 1/e after about `window` points.
  const double w = window <= 1 ? 0 : 1.0 - 1.0 / window;
  Series out;
  out.x = s.x;
  out.y.resize(s.size());
  double avg = 0, norm = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (std::isfinite(s.y[i])) {
      avg = w * avg + (1 - w) * s.y[i];
      norm = w * norm + (1 - w);
    }
    out.y[i] = norm > 0 ? avg / norm : s.y[i];
  }
  return out;
}

}  // namespace dptrain::report
