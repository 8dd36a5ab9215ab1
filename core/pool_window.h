// SPDX-License-Identifier: Apache-2.0
// Pooling window arithmetic written once for both backends (`__host__ __device__` under nvcc,
// as elementwise.h): which input rectangle an output position reads, the average's divisor with
// PyTorch's rules, and which outputs read a given input (the gather form of backward). The CPU
// average pooling loops and the CUDA pooling kernels call exactly these functions.
#pragma once

#include <cstdint>

#include "core/elementwise.h"

namespace dptrain::ew {

// (planes) H x W inputs pooled into P x Q outputs by a square window. The last windows of
// ceil mode may reach past the right/bottom padding; `count_include_pad` is PyTorch's (and
// ONNX's) flag for the average.
struct PoolGeom {
  int64_t planes, h, w, p, q, kernel, stride, pad;
  bool count_include_pad;
};

// The input rows [h0, h1) and columns [w0, w1) output (oh, ow) reads, clipped to the input,
// and the average's divisor. As torch.nn.AvgPool2d: with count_include_pad the window is first
// clipped to the padded input (H + pad), so in ceil mode a last window hanging past the padding
// divides by fewer than kernel^2; without it, by the number of real inputs.
struct PoolWindow {
  int64_t h0, h1, w0, w1;
  float divisor;
};
DPT_HD PoolWindow WindowOf(const PoolGeom& g, int64_t oh, int64_t ow) {
  PoolWindow r;
  r.h0 = oh * g.stride - g.pad;
  r.w0 = ow * g.stride - g.pad;
  r.h1 = r.h0 + g.kernel < g.h + g.pad ? r.h0 + g.kernel : g.h + g.pad;
  r.w1 = r.w0 + g.kernel < g.w + g.pad ? r.w0 + g.kernel : g.w + g.pad;
  const int64_t padded = (r.h1 - r.h0) * (r.w1 - r.w0);
  r.h0 = r.h0 > 0 ? r.h0 : 0;
  r.w0 = r.w0 > 0 ? r.w0 : 0;
  r.h1 = r.h1 < g.h ? r.h1 : g.h;
  r.w1 = r.w1 < g.w ? r.w1 : g.w;
  r.divisor = static_cast<float>(g.count_include_pad ? padded : (r.h1 - r.h0) * (r.w1 - r.w0));
  return r;
}

// The outputs [p0, p1) x [q0, q1) whose windows contain input (ih, iw).
struct PoolCover {
  int64_t p0, p1, q0, q1;
};
DPT_HD PoolCover Covering(const PoolGeom& g, int64_t ih, int64_t iw) {
  PoolCover r;
  r.p0 = ih + g.pad < g.kernel ? 0 : (ih + g.pad - g.kernel) / g.stride + 1;
  r.q0 = iw + g.pad < g.kernel ? 0 : (iw + g.pad - g.kernel) / g.stride + 1;
  r.p1 = (ih + g.pad) / g.stride + 1 < g.p ? (ih + g.pad) / g.stride + 1 : g.p;
  r.q1 = (iw + g.pad) / g.stride + 1 < g.q ? (iw + g.pad) / g.stride + 1 : g.q;
  return r;
}

// Where (N, C, HW) data keeps position `pos` of plane `plane` (sample plane / c, channel
// plane % c): NCHW, or channels-last (NHWC: the channels of a position side by side). A plane's
// positions then lie 1 (NCHW) or c (NHWC) elements apart (PlaneStep).
DPT_HD int64_t PlaneIndex(int64_t plane, int64_t pos, int64_t c, int64_t hw, bool nhwc) {
  return nhwc ? ((plane / c) * hw + pos) * c + plane % c : plane * hw + pos;
}
DPT_HD int64_t PlaneStep(int64_t c, bool nhwc) { return nhwc ? c : 1; }
// The inverse of PlaneIndex: the plane and position of memory index e.
DPT_HD void PlanePosition(int64_t e, int64_t c, int64_t hw, bool nhwc, int64_t* plane,
                          int64_t* pos) {
  if (nhwc) {
    const int64_t r = e / c;
    *pos = r % hw;
    *plane = (r / hw) * c + e % c;
  } else {
    *plane = e / hw;
    *pos = e % hw;
  }
}

// Average pooling of one plane: output (oh, ow) and, for backward, input (ih, iw)'s gradient
// gathered from every window that reads it (no atomics: deterministic on both backends). A plane's
// elements lie `step` floats apart: 1 in NCHW, C in channels-last (NHWC), summed in the same order.
DPT_HD float AvgPoolAt(const PoolGeom& g, const float* plane, int64_t oh, int64_t ow,
                       int64_t step = 1) {
  const PoolWindow win = WindowOf(g, oh, ow);
  float s = 0.f;
  for (int64_t i = win.h0; i < win.h1; ++i) {
    for (int64_t j = win.w0; j < win.w1; ++j) s += plane[(i * g.w + j) * step];
  }
  return s / win.divisor;
}
DPT_HD float AvgPoolGradAt(const PoolGeom& g, const float* dy_plane, int64_t ih, int64_t iw,
                           int64_t step = 1) {
  const PoolCover c = Covering(g, ih, iw);
  float s = 0.f;
  for (int64_t p = c.p0; p < c.p1; ++p) {
    for (int64_t q = c.q0; q < c.q1; ++q) {
      s += dy_plane[(p * g.q + q) * step] / WindowOf(g, p, q).divisor;
    }
  }
  return s;
}

}  // namespace dptrain::ew
