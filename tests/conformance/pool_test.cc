// SPDX-License-Identifier: Apache-2.0
// Max and average pooling on every built backend against the double reference: forward (training
// with workspace, inference without) and backward on odd sizes, padding, overlapping windows
// (stride < kernel), global pooling, ceil mode and count_include_pad both ways. Max-pool inputs are
// distinct, so there are no ties. Each case also channels-last (PoolDesc::nhwc) where the backend
// prefers it, and max pooling channels-last with y in NCHW (PoolDesc::y_nchw) where it runs that.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/pool_window.h"
#include "tests/testing/backends.h"
#include "tests/testing/reference_ops.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {
namespace {

PoolDesc MakePool(PoolKind kind, int64_t n, int64_t c, int64_t h, int64_t w, int64_t kernel,
                  int64_t stride, int64_t pad, bool ceil_mode = false,
                  bool count_include_pad = true) {
  PoolDesc d;
  d.kind = kind, d.n = n, d.c = c, d.h = h, d.w = w;
  d.kernel = kernel, d.stride = stride, d.pad = pad;
  d.ceil_mode = ceil_mode, d.count_include_pad = count_include_pad;
  return d;
}

// Padding never exceeds kernel/2 (PyTorch's rule), so every window sees at least one real value.
std::vector<PoolDesc> Cases(PoolKind kind) {
  return {
      MakePool(kind, 1, 1, 1, 1, 1, 1, 0),    // identity
      MakePool(kind, 2, 3, 8, 8, 2, 2, 0),    // the usual 2x2/2
      MakePool(kind, 2, 3, 7, 5, 2, 2, 0),    // odd sizes: last row/column dropped
      MakePool(kind, 1, 3, 7, 5, 3, 2, 1),    // batch 1, padding
      MakePool(kind, 2, 2, 9, 7, 3, 1, 1),    // overlapping windows
      MakePool(kind, 2, 3, 11, 13, 5, 3, 2),  // kernel 5, pad 2
      MakePool(kind, 3, 5, 6, 6, 6, 6, 0),    // global pooling
      MakePool(kind, 1, 7, 5, 9, 3, 3, 1),    // prime channels, pad 1 stride 3
      // ceil mode: the last window hangs past the input (6 rows -> 3 outputs of 3/2, not 2)
      // and, with padding, past the padding too (divisor below kernel^2 with count_include_pad)
      MakePool(kind, 2, 3, 6, 7, 3, 2, 0, true),
      MakePool(kind, 1, 2, 6, 8, 3, 2, 1, true),
      MakePool(kind, 2, 2, 5, 5, 2, 2, 0, true),  // squeezenet/googlenet's odd-size pooling
      MakePool(kind, 1, 3, 9, 6, 4, 3, 2, true),  // stride < kernel
      MakePool(kind, 1, 2, 5, 5, 2, 2, 1, true),  // a window starting in the padding is dropped
      // channels-last steps of 16 channels and a tail: overlapping with padding, and ceil mode
      MakePool(kind, 2, 35, 9, 7, 3, 2, 1),
      MakePool(kind, 1, 16, 6, 7, 3, 2, 0, true),
      // large enough for the threaded loops (kParallelMin), without and with overlap
      MakePool(kind, 4, 32, 16, 16, 2, 2, 0),
      MakePool(kind, 2, 24, 20, 20, 3, 2, 1),
      // a 16 x 16 window (the largest whose window index fits the CPU's byte) and a 17 x 17 one
      MakePool(kind, 1, 3, 16, 16, 16, 16, 0),
      MakePool(kind, 1, 2, 17, 17, 17, 17, 0),
      // count_include_pad = 0: the average over the real inputs only
      MakePool(kind, 2, 3, 7, 5, 3, 2, 1, false, false),
      MakePool(kind, 1, 2, 6, 8, 3, 2, 1, true, false),
  };
}

Shape XShape(const PoolDesc& d) { return {d.n, d.c, d.h, d.w}; }
Shape YShape(const PoolDesc& d) { return {d.n, d.c, d.out_h(), d.out_w()}; }

// Workspace for training forward/backward, or an undefined tensor when the plan needs none.
Tensor Workspace(Backend& be, const OpPlan& plan) {
  if (plan.workspace_bytes == 0) return {};
  return be.Empty({static_cast<int64_t>(plan.workspace_bytes)}, DType::kU8, "pool ws");
}

std::vector<float> Inputs(const PoolDesc& d, uint32_t seed) {
  const size_t n = static_cast<size_t>(XShape(d).numel());
  return d.kind == PoolKind::kMax ? RandomDistinct(n, seed) : RandomUniform(n, seed);
}

// The layouts each case runs in: NCHW, channels-last, and channels-last with y and dy NCHW.
struct Layout {
  bool nhwc, y_nchw;
};
constexpr Layout kLayouts[] = {{false, false}, {true, false}, {true, true}};

// Host values in NCHW order onto the backend in d's layout for x and dx (In, Out) or for y and dy
// (InY, OutY), and back (InLayout, ToHostNchw).
Tensor In(Backend& be, const PoolDesc& d, const std::vector<float>& v, const Shape& s) {
  return InLayout(be, v, s, d.nhwc);
}
std::vector<float> Out(Backend& be, const PoolDesc& d, const Tensor& t) {
  return ToHostNchw(be, t, d.nhwc);
}
Tensor InY(Backend& be, const PoolDesc& d, const std::vector<float>& v) {
  return InLayout(be, v, YShape(d), d.nhwc && !d.y_nchw);
}
std::vector<float> OutY(Backend& be, const PoolDesc& d, const Tensor& t) {
  return ToHostNchw(be, t, d.nhwc && !d.y_nchw);
}

void CheckPool(Backend& be, const PoolDesc& d, uint32_t seed) {
  SCOPED_TRACE(d.ToString());
  const std::vector<float> x = Inputs(d, seed);
  const std::vector<float> dy = RandomUniform(static_cast<size_t>(YShape(d).numel()), seed + 1);
  auto plan = be.PreparePool(d);
  Tensor ws = Workspace(be, *plan);
  Tensor* ws_ptr = ws.defined() ? &ws : nullptr;
  Tensor x_t = In(be, d, x, XShape(d));
  Tensor y = be.Empty(YShape(d), DType::kF32, "y");
  be.PoolForward(*plan, x_t, &y, ws_ptr);

  std::vector<double> ref_y, ref_dx;
  ref::PoolForward(d, ToDouble(x), &ref_y);
  // Max pooling is exact; average pooling is a sum of kernel^2 terms.
  const Tolerance tol = ForReduction(Precision::kF32, d.kernel * d.kernel);
  EXPECT_TRUE(AllClose(OutY(be, d, y), ref_y, tol)) << "training forward";

  Tensor y_inf = be.Empty(YShape(d), DType::kF32, "y inference");
  be.PoolForward(*plan, x_t, &y_inf, nullptr);
  EXPECT_TRUE(AllClose(OutY(be, d, y_inf), ref_y, tol)) << "inference forward";

  Tensor dy_t = InY(be, d, dy);
  Tensor dx = ToDevice(be, RandomUniform(static_cast<size_t>(XShape(d).numel()), 99), XShape(d));
  be.PoolBackward(*plan, dy_t, ws_ptr, &dx);
  ref::PoolBackward(d, ToDouble(x), ToDouble(dy), &ref_dx);
  // An input can receive gradient from up to ceil(kernel/stride)^2 windows.
  const int64_t fan = (d.kernel + d.stride - 1) / d.stride;
  EXPECT_TRUE(AllClose(Out(be, d, dx), ref_dx, ForReduction(Precision::kF32, fan * fan)))
      << "backward";
}

class PoolTest : public BackendTest {
 protected:
  void RunAll(PoolKind kind) {
    std::string unsupported;
    uint32_t seed = 3000;
    for (PoolDesc d : Cases(kind)) {
      seed += 10;
      for (const Layout l : kLayouts) {  // channels-last where the backend runs it
        d.nhwc = l.nhwc, d.y_nchw = l.y_nchw;
        if (!backend().Supports(d)) {
          // y in NCHW is a max pool's own, where the backend has it (MaxChannelsLastYInNchw).
          if (!l.nhwc || (backend().PrefersChannelsLast() && !l.y_nchw))
            unsupported += " [" + d.ToString() + "]";
          continue;
        }
        CheckPool(backend(), d, seed);
      }
    }
    if (!unsupported.empty()) GTEST_SKIP() << backend().name() << ": unsupported" << unsupported;
  }
};

TEST_P(PoolTest, Max) { RunAll(PoolKind::kMax); }

TEST_P(PoolTest, Avg) { RunAll(PoolKind::kAvg); }

// Ties (a constant image): the forward value is exact, the gradient of each window goes to one
// position holding the maximum, and no gradient is lost or duplicated. dptrain's own loops (the
// CUDA kernels, the CPU's channels-last pooling: 19 channels, a vector step and a tail) give it
// to the first position in row-major window order, as PyTorch; oneDNN's (the CPU's
// channels-first pooling) is not held to one.
TEST_P(PoolTest, MaxTiesKeepGradientMass) {
  Backend& be = backend();
  int ran = 0;
  // non-overlapping windows; 32 channels: the CPU's 2 x 2 loops for whole vectors (pair_rows)
  for (const auto& [nhwc, c] : {std::pair{false, 19}, std::pair{true, 19}, std::pair{true, 32}}) {
    PoolDesc d = MakePool(PoolKind::kMax, 1, c, 4, 4, 2, 2, 0);
    d.nhwc = nhwc;
    if (!be.Supports(d)) continue;
    SCOPED_TRACE(d.ToString());
    ++ran;
    const bool first_wins = be.name() != "cpu" || nhwc;
    const std::vector<float> x(static_cast<size_t>(XShape(d).numel()), 0.5f);
    const std::vector<float> dy = RandomUniform(static_cast<size_t>(YShape(d).numel()), 5);
    auto plan = be.PreparePool(d);
    Tensor ws = Workspace(be, *plan);
    Tensor* ws_ptr = ws.defined() ? &ws : nullptr;
    Tensor y = be.Empty(YShape(d), DType::kF32, "y");
    be.PoolForward(*plan, In(be, d, x, XShape(d)), &y, ws_ptr);
    EXPECT_TRUE(AllClose(OutY(be, d, y), std::vector<double>(dy.size(), 0.5), kExactTol));

    Tensor dx = be.Empty(XShape(d), DType::kF32, "dx");
    be.PoolBackward(*plan, InY(be, d, dy), ws_ptr, &dx);
    const std::vector<float> got = Out(be, d, dx);
    const int64_t P = d.out_h(), Q = d.out_w();
    for (int64_t nc = 0; nc < d.n * d.c; ++nc) {
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t q = 0; q < Q; ++q) {
          int nonzero = 0;
          double sum = 0.0;
          for (int64_t i = 0; i < d.kernel; ++i) {
            for (int64_t j = 0; j < d.kernel; ++j) {
              const float g =
                  got[static_cast<size_t>((nc * d.h + p * d.stride + i) * d.w + q * d.stride + j)];
              if (g != 0.f) ++nonzero;
              sum += g;
            }
          }
          const double want = dy[static_cast<size_t>((nc * P + p) * Q + q)];
          EXPECT_EQ(nonzero, 1) << "window (" << nc << ", " << p << ", " << q << ")";
          EXPECT_TRUE(Close(sum, want, kExactTol))
              << "window (" << nc << ", " << p << ", " << q << ")";
          if (first_wins) {
            const float at_first =
                got[static_cast<size_t>((nc * d.h + p * d.stride) * d.w + q * d.stride)];
            EXPECT_TRUE(Close(at_first, want, kExactTol))
                << "window (" << nc << ", " << p << ", " << q << "): not at its first position";
          }
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << be.name() << ": no max pooling";
}

// A NaN in a window wins over every number there, as in PyTorch (a diverging model shows it in
// the loss, not hidden by a pool): the window's output is NaN and its gradient goes to the NaN.
// 19 channels: in channels-last a full step of 16 and a tail. Non-overlapping windows, so each
// gradient has one place to go; a second, overlapping case for the forward. Not the CPU backend's
// channels-first max pooling: oneDNN's, where a NaN loses.
TEST_P(PoolTest, MaxNaNWins) {
  Backend& be = backend();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int ran = 0;
  for (PoolDesc d : {MakePool(PoolKind::kMax, 2, 19, 6, 6, 2, 2, 0),
                     MakePool(PoolKind::kMax, 2, 32, 6, 6, 2, 2, 0),
                     MakePool(PoolKind::kMax, 2, 19, 7, 7, 3, 2, 1)}) {
    for (const bool nhwc : {false, true}) {
      d.nhwc = nhwc;
      // oneDNN's max pooling (the CPU backend's, channels-first) takes the larger of two values
      // with NaN losing; the CPU backend prefers channels-last, where its own loops run.
      if (!be.Supports(d) || (!nhwc && be.name() == "cpu")) continue;
      SCOPED_TRACE(d.ToString());
      ++ran;
      const Shape xs = XShape(d), ys = YShape(d);
      std::vector<float> x = RandomDistinct(static_cast<size_t>(xs.numel()), 77);
      // NaNs (NCHW index (i, c, h, w)): one per plane in a few planes, at varied window spots.
      std::vector<int64_t> nans;
      for (int64_t plane = 0; plane < d.n * d.c; plane += 3) {
        const int64_t h = plane % d.h, w = (plane * 5 + 1) % d.w;
        nans.push_back((plane * d.h + h) * d.w + w);
      }
      // and in every fourth plane two in its first window, (0, 0) and (1, 1): the last one wins
      for (int64_t plane = 1; plane < d.n * d.c; plane += 4) {
        nans.push_back(plane * d.h * d.w);
        nans.push_back((plane * d.h + 1) * d.w + 1);
      }
      for (const int64_t at : nans) x[static_cast<size_t>(at)] = nan;
      auto plan = be.PreparePool(d);
      Tensor ws = Workspace(be, *plan);
      Tensor* ws_ptr = ws.defined() ? &ws : nullptr;
      Tensor y = be.Empty(ys, DType::kF32, "y");
      be.PoolForward(*plan, In(be, d, x, xs), &y, ws_ptr);
      const std::vector<float> got = OutY(be, d, y);
      const std::vector<float> dy = RandomUniform(static_cast<size_t>(ys.numel()), 78);
      Tensor dx = be.Empty(xs, DType::kF32, "dx");
      be.PoolBackward(*plan, InY(be, d, dy), ws_ptr, &dx);
      const std::vector<float> grad = Out(be, d, dx);
      const ew::PoolGeom g{d.n * d.c, d.h,      d.w,   d.out_h(),          d.out_w(),
                           d.kernel,  d.stride, d.pad, d.count_include_pad};
      int windows_with_nan = 0;
      for (int64_t plane = 0; plane < d.n * d.c; ++plane) {
        for (int64_t p = 0; p < g.p; ++p) {
          for (int64_t q = 0; q < g.q; ++q) {
            const ew::PoolWindow win = ew::WindowOf(g, p, q);
            int64_t nan_at = -1;
            float best = -std::numeric_limits<float>::infinity();
            for (int64_t h = win.h0; h < win.h1; ++h) {
              for (int64_t w = win.w0; w < win.w1; ++w) {
                const int64_t e = (plane * d.h + h) * d.w + w;
                if (std::isnan(x[static_cast<size_t>(e)])) nan_at = e;
                best = std::max(best, x[static_cast<size_t>(e)]);
              }
            }
            const size_t o = static_cast<size_t>((plane * g.p + p) * g.q + q);
            if (nan_at < 0) {
              EXPECT_EQ(got[o], best) << "plane " << plane << " window (" << p << ", " << q << ")";
              continue;
            }
            ++windows_with_nan;
            EXPECT_TRUE(std::isnan(got[o]))
                << "plane " << plane << " window (" << p << ", " << q << "): " << got[o];
            if (d.stride == d.kernel) {  // all of dy to the last NaN, none elsewhere
              for (int64_t h = win.h0; h < win.h1; ++h) {
                for (int64_t w = win.w0; w < win.w1; ++w) {
                  const int64_t e = (plane * d.h + h) * d.w + w;
                  EXPECT_EQ(grad[static_cast<size_t>(e)], e == nan_at ? dy[o] : 0.f)
                      << "the gradient of plane " << plane << " window (" << p << ", " << q
                      << ") at (" << h << ", " << w << ")";
                }
              }
            }
          }
        }
      }
      EXPECT_GT(windows_with_nan, 0);
    }
  }
  if (ran == 0) GTEST_SKIP() << be.name() << ": no max pooling";
}

// PoolDesc::dx_bf16 (max pooling, windows that do not overlap, where the backend runs it): the
// input gradient written in bf16 is the f32 plan's, rounded (ew::FloatToBf16), bit for bit, in
// both layouts; overlapping windows (a sum per input) and average pooling are refused.
TEST_P(PoolTest, MaxInputGradientInBf16IsTheF32OneRounded) {
  Backend& be = backend();
  int ran = 0;
  uint32_t seed = 4000;
  for (PoolDesc d : Cases(PoolKind::kMax)) {
    for (const Layout l : kLayouts) {
      d.nhwc = l.nhwc, d.y_nchw = l.y_nchw;
      d.dx_bf16 = true;
      seed += 10;
      if (d.stride < d.kernel) {
        EXPECT_FALSE(be.Supports(d)) << d.ToString();
        continue;
      }
      if (!be.Supports(d)) continue;
      SCOPED_TRACE(d.ToString());
      ++ran;
      PoolDesc f32 = d;
      f32.dx_bf16 = false;
      const std::vector<float> x = Inputs(d, seed);
      const std::vector<float> dy = RandomUniform(static_cast<size_t>(YShape(d).numel()), seed + 1);
      const auto plan = be.PreparePool(d), plan_f32 = be.PreparePool(f32);
      Tensor ws = Workspace(be, *plan), ws_f32 = Workspace(be, *plan_f32);
      Tensor x_t = ToDevice(be, x, XShape(d)), dy_t = ToDevice(be, dy, YShape(d));
      Tensor y = be.Empty(YShape(d), DType::kF32, "y");
      be.PoolForward(*plan, x_t, &y, ws.defined() ? &ws : nullptr);
      be.PoolForward(*plan_f32, x_t, &y, ws_f32.defined() ? &ws_f32 : nullptr);
      Tensor dx = be.Empty(XShape(d), DType::kBF16, "dx bf16");
      Tensor dx_f32 = be.Empty(XShape(d), DType::kF32, "dx");
      be.PoolBackward(*plan, dy_t, ws.defined() ? &ws : nullptr, &dx);
      be.PoolBackward(*plan_f32, dy_t, ws_f32.defined() ? &ws_f32 : nullptr, &dx_f32);
      EXPECT_EQ(CountNotRounded(be, dx, dx_f32), 0);
    }
  }
  PoolDesc avg = MakePool(PoolKind::kAvg, 2, 3, 8, 8, 2, 2, 0);
  avg.dx_bf16 = true;
  EXPECT_FALSE(be.Supports(avg));
  if (ran == 0) GTEST_SKIP() << be.name() << ": no bf16 input gradients for max pooling";
}

// PoolDesc::y_nchw, where the backend prefers channels-last: max pooling the shapes that precede a
// flatten (ref_cnn's second pool: a 2 x 2 window at stride 2 over 64 channels; and a 3 x 3 window
// at stride 2 with padding over a channel count that leaves a tail of 16) writes y and reads dy in
// NCHW with the same values, window positions and input gradients, bit for bit, as the
// channels-last plan, in training and inference, and dx in f32 and bf16. Average pooling refuses.
TEST_P(PoolTest, MaxChannelsLastYInNchw) {
  Backend& be = backend();
  if (!be.PrefersChannelsLast()) GTEST_SKIP() << be.name() << ": pools in NCHW (no y_nchw)";
  uint32_t seed = 5000;
  for (PoolDesc d : {MakePool(PoolKind::kMax, 3, 64, 14, 14, 2, 2, 0),
                     MakePool(PoolKind::kMax, 2, 35, 9, 7, 3, 2, 1)}) {
    for (const bool dx_bf16 : {false, true}) {
      d.nhwc = true, d.dx_bf16 = dx_bf16;
      PoolDesc planar = d;
      planar.y_nchw = true;
      SCOPED_TRACE(planar.ToString());
      if (dx_bf16 && !be.Supports(d)) continue;  // a bf16 precision the machine lacks
      ASSERT_TRUE(be.Supports(planar));
      seed += 10;
      const std::vector<float> x = Inputs(d, seed);
      const std::vector<float> dy = RandomUniform(static_cast<size_t>(YShape(d).numel()), seed + 1);
      const auto run = [&](const PoolDesc& pd, std::vector<float>* y, std::vector<float>* y_inf,
                           std::vector<float>* dx) {
        const auto plan = be.PreparePool(pd);
        Tensor ws = Workspace(be, *plan);
        Tensor x_t = In(be, pd, x, XShape(pd)), dy_t = InY(be, pd, dy);
        Tensor y_t = be.Empty(YShape(pd), DType::kF32, "y");
        be.PoolForward(*plan, x_t, &y_t, nullptr);
        *y_inf = OutY(be, pd, y_t);
        be.PoolForward(*plan, x_t, &y_t, &ws);
        *y = OutY(be, pd, y_t);
        Tensor dx_t = be.Empty(XShape(pd), pd.dx_bf16 ? DType::kBF16 : DType::kF32, "dx");
        be.PoolBackward(*plan, dy_t, &ws, &dx_t);
        if (!pd.dx_bf16) {
          *dx = ToHost(be, dx_t);  // channels-last in both runs
          return;
        }
        std::vector<uint16_t> bits(static_cast<size_t>(dx_t.numel()));
        be.CopyToHost(dx_t, bits.data());
        dx->resize(bits.size());
        for (size_t i = 0; i < bits.size(); ++i) {
          const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;  // bf16 widens exactly
          std::memcpy(&(*dx)[i], &word, sizeof(word));
        }
      };
      std::vector<float> want_y, want_inf, want_dx, y, y_inf, dx;
      run(d, &want_y, &want_inf, &want_dx);
      run(planar, &y, &y_inf, &dx);
      EXPECT_EQ(y, want_y) << "training forward";
      EXPECT_EQ(y_inf, want_inf) << "inference forward";
      EXPECT_EQ(dx, want_dx) << "backward";
    }
  }
  PoolDesc avg = MakePool(PoolKind::kAvg, 2, 3, 8, 8, 2, 2, 0);
  avg.nhwc = avg.y_nchw = true;
  EXPECT_FALSE(be.Supports(avg));
}

INSTANTIATE_TEST_SUITE_P(All, PoolTest, ::testing::ValuesIn(TestBackends()), BackendParamName);

// Where the CUDA pooling kernels find a plane's positions (ew::PlaneIndex, PlanePosition; shared
// code, run here on the CPU): NCHW and channels-last, against the layouts' definitions.
TEST(PoolLayoutTest, PlaneIndexAndPositionAreInverseInBothLayouts) {
  const int64_t n = 2, c = 3, hw = 5;
  for (const bool nhwc : {false, true}) {
    std::vector<int> seen(static_cast<size_t>(n * c * hw), 0);
    for (int64_t plane = 0; plane < n * c; ++plane) {
      for (int64_t pos = 0; pos < hw; ++pos) {
        const int64_t s = plane / c, ch = plane % c;
        const int64_t want = nhwc ? (s * hw + pos) * c + ch : (s * c + ch) * hw + pos;
        const int64_t e = ew::PlaneIndex(plane, pos, c, hw, nhwc);
        EXPECT_EQ(e, want) << nhwc << " " << plane << " " << pos;
        EXPECT_EQ(e - ew::PlaneIndex(plane, 0, c, hw, nhwc), pos * ew::PlaneStep(c, nhwc));
        int64_t p2 = -1, q2 = -1;
        ew::PlanePosition(e, c, hw, nhwc, &p2, &q2);
        EXPECT_EQ(p2, plane);
        EXPECT_EQ(q2, pos);
        ++seen[static_cast<size_t>(e)];
      }
    }
    for (int v : seen) EXPECT_EQ(v, 1) << "every element once";
  }
}

}  // namespace
}  // namespace dptrain::testing
