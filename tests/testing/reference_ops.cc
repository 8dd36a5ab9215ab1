// SPDX-License-Identifier: Apache-2.0
// Naive double-precision reference ops. Each function is the textbook loop nest of its
// definition; the backward passes scatter exactly what the forward gathered, so forward and
// backward visibly agree. Speed does not matter: conformance shapes are small. Over 400 lines on
// purpose: the reference for every op of reference_ops.h in one place, in the header's order.
#include "tests/testing/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace dptrain::ref {
namespace {

void CheckSize(const Vec& v, int64_t n, const char* what) {
  DPT_CHECK(static_cast<int64_t>(v.size()) == n)
      << what << " has " << v.size() << " elements, expected " << n;
}

// Prepares a gradient output: resized to zero, or (accumulate) checked to be of size n already.
void PrepareGrad(Vec* g, int64_t n, bool accumulate, const char* what) {
  if (accumulate) {
    CheckSize(*g, n, what);
  } else {
    g->assign(static_cast<size_t>(n), 0.0);
  }
}

size_t At(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// conv2d

// Calls f(x index, w index) for every tap that output (n, k, p, q) reads inside the input:
// group gi = k / (K/G) sees input channels [gi*C/G, (gi+1)*C/G); taps are `dilation` apart.
template <class F>
void ForEachTap(const Conv2dDesc& d, int64_t n, int64_t k, int64_t p, int64_t q, F&& f) {
  const int64_t cg = d.group_c(), first = k / (d.k / d.groups) * cg;
  for (int64_t cc = 0; cc < cg; ++cc) {
    for (int64_t r = 0; r < d.r; ++r) {
      for (int64_t s = 0; s < d.s; ++s) {
        const int64_t ih = p * d.stride - d.pad + r * d.dilation;
        const int64_t iw = q * d.stride - d.pad + s * d.dilation;
        if (ih < 0 || ih >= d.h || iw < 0 || iw >= d.w) continue;  // zero padding
        f(At(((n * d.c + first + cc) * d.h + ih) * d.w + iw),
          At(((k * cg + cc) * d.r + r) * d.s + s));
      }
    }
  }
}

// Calls f(n, k, p, q, output index) for every output element.
template <class F>
void ForEachOutput(const Conv2dDesc& d, F&& f) {
  const int64_t P = d.out_h(), Q = d.out_w();
  for (int64_t n = 0; n < d.n; ++n) {
    for (int64_t k = 0; k < d.k; ++k) {
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t q = 0; q < Q; ++q) f(n, k, p, q, At(((n * d.k + k) * P + p) * Q + q));
      }
    }
  }
}

void Conv2dForward(const Conv2dDesc& d, const Vec& x, const Vec& w, const Vec* b, Vec* y) {
  CheckSize(x, d.n * d.c * d.h * d.w, "conv x");
  CheckSize(w, d.weight_numel(), "conv w");
  if (b != nullptr) CheckSize(*b, d.k, "conv b");
  y->assign(At(d.n * d.k * d.out_h() * d.out_w()), 0.0);
  ForEachOutput(d, [&](int64_t n, int64_t k, int64_t p, int64_t q, size_t o) {
    double acc = b != nullptr ? (*b)[At(k)] : 0.0;
    ForEachTap(d, n, k, p, q, [&](size_t xi, size_t wi) { acc += x[xi] * w[wi]; });
    (*y)[o] = d.relu ? std::max(acc, 0.0) : acc;
  });
}

void Conv2dBackwardData(const Conv2dDesc& d, const Vec& dy, const Vec& w, Vec* dx) {
  CheckSize(dy, d.n * d.k * d.out_h() * d.out_w(), "conv dy");
  CheckSize(w, d.weight_numel(), "conv w");
  dx->assign(At(d.n * d.c * d.h * d.w), 0.0);
  // Scatter each output gradient back through the taps that produced that output.
  ForEachOutput(d, [&](int64_t n, int64_t k, int64_t p, int64_t q, size_t o) {
    const double g = dy[o];
    ForEachTap(d, n, k, p, q, [&](size_t xi, size_t wi) { (*dx)[xi] += g * w[wi]; });
  });
}

void Conv2dBackwardWeights(const Conv2dDesc& d, const Vec& x, const Vec& dy, Vec* dw, Vec* db,
                           bool accumulate) {
  CheckSize(x, d.n * d.c * d.h * d.w, "conv x");
  CheckSize(dy, d.n * d.k * d.out_h() * d.out_w(), "conv dy");
  PrepareGrad(dw, d.weight_numel(), accumulate, "conv dw");
  if (db != nullptr) PrepareGrad(db, d.k, accumulate, "conv db");
  ForEachOutput(d, [&](int64_t n, int64_t k, int64_t p, int64_t q, size_t o) {
    const double g = dy[o];
    if (db != nullptr) (*db)[At(k)] += g;
    ForEachTap(d, n, k, p, q, [&](size_t xi, size_t wi) { (*dw)[wi] += g * x[xi]; });
  });
}

// ---------------------------------------------------------------------------------------------
// linear

void LinearForward(const LinearDesc& d, const Vec& x, const Vec& w, const Vec* b, Vec* y) {
  CheckSize(x, d.n * d.in, "linear x");
  CheckSize(w, d.out * d.in, "linear w");
  if (b != nullptr) CheckSize(*b, d.out, "linear b");
  y->assign(At(d.n * d.out), 0.0);
  for (int64_t n = 0; n < d.n; ++n) {
    for (int64_t o = 0; o < d.out; ++o) {
      double acc = b != nullptr ? (*b)[At(o)] : 0.0;
      for (int64_t i = 0; i < d.in; ++i) acc += x[At(n * d.in + i)] * w[At(o * d.in + i)];
      (*y)[At(n * d.out + o)] = acc;
    }
  }
}

void LinearBackwardData(const LinearDesc& d, const Vec& dy, const Vec& w, Vec* dx) {
  CheckSize(dy, d.n * d.out, "linear dy");
  CheckSize(w, d.out * d.in, "linear w");
  dx->assign(At(d.n * d.in), 0.0);
  for (int64_t n = 0; n < d.n; ++n) {
    for (int64_t i = 0; i < d.in; ++i) {
      double acc = 0.0;
      for (int64_t o = 0; o < d.out; ++o) acc += dy[At(n * d.out + o)] * w[At(o * d.in + i)];
      (*dx)[At(n * d.in + i)] = acc;
    }
  }
}

void LinearBackwardWeights(const LinearDesc& d, const Vec& x, const Vec& dy, Vec* dw, Vec* db,
                           bool accumulate) {
  CheckSize(x, d.n * d.in, "linear x");
  CheckSize(dy, d.n * d.out, "linear dy");
  PrepareGrad(dw, d.out * d.in, accumulate, "linear dw");
  if (db != nullptr) PrepareGrad(db, d.out, accumulate, "linear db");
  for (int64_t o = 0; o < d.out; ++o) {
    for (int64_t i = 0; i < d.in; ++i) {
      double acc = 0.0;
      for (int64_t n = 0; n < d.n; ++n) acc += dy[At(n * d.out + o)] * x[At(n * d.in + i)];
      (*dw)[At(o * d.in + i)] += acc;
    }
    if (db != nullptr) {
      double acc = 0.0;
      for (int64_t n = 0; n < d.n; ++n) acc += dy[At(n * d.out + o)];
      (*db)[At(o)] += acc;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// pooling

namespace {

// The average's divisor for output (p, q), from PyTorch's definition: with count_include_pad
// the window's positions inside the padded input [-pad, H + pad), else its real inputs.
double PoolDivisor(const PoolDesc& d, int64_t p, int64_t q) {
  int64_t count = 0;
  for (int64_t i = 0; i < d.kernel; ++i) {
    for (int64_t j = 0; j < d.kernel; ++j) {
      const int64_t ih = p * d.stride - d.pad + i;
      const int64_t iw = q * d.stride - d.pad + j;
      const bool real = ih >= 0 && ih < d.h && iw >= 0 && iw < d.w;
      const bool padded = ih < d.h + d.pad && iw < d.w + d.pad;
      if (d.count_include_pad ? padded : real) ++count;
    }
  }
  return static_cast<double>(count);
}

}  // namespace

void PoolForward(const PoolDesc& d, const Vec& x, Vec* y) {
  const int64_t P = d.out_h(), Q = d.out_w();
  CheckSize(x, d.n * d.c * d.h * d.w, "pool x");
  y->assign(At(d.n * d.c * P * Q), 0.0);
  for (int64_t nc = 0; nc < d.n * d.c; ++nc) {
    for (int64_t p = 0; p < P; ++p) {
      for (int64_t q = 0; q < Q; ++q) {
        double best = -std::numeric_limits<double>::infinity();
        double sum = 0.0;
        for (int64_t i = 0; i < d.kernel; ++i) {
          for (int64_t j = 0; j < d.kernel; ++j) {
            const int64_t ih = p * d.stride - d.pad + i;
            const int64_t iw = q * d.stride - d.pad + j;
            if (ih < 0 || ih >= d.h || iw < 0 || iw >= d.w) continue;  // -inf (max), 0 (avg)
            const double v = x[At((nc * d.h + ih) * d.w + iw)];
            if (v > best) best = v;
            sum += v;
          }
        }
        (*y)[At((nc * P + p) * Q + q)] =
            d.kind == PoolKind::kMax ? best : sum / PoolDivisor(d, p, q);
      }
    }
  }
}

void PoolBackward(const PoolDesc& d, const Vec& x, const Vec& dy, Vec* dx) {
  const int64_t P = d.out_h(), Q = d.out_w();
  CheckSize(x, d.n * d.c * d.h * d.w, "pool x");
  CheckSize(dy, d.n * d.c * P * Q, "pool dy");
  dx->assign(At(d.n * d.c * d.h * d.w), 0.0);
  for (int64_t nc = 0; nc < d.n * d.c; ++nc) {
    for (int64_t p = 0; p < P; ++p) {
      for (int64_t q = 0; q < Q; ++q) {
        const double g = dy[At((nc * P + p) * Q + q)];
        const double area = d.kind == PoolKind::kAvg ? PoolDivisor(d, p, q) : 1.0;
        int64_t arg = -1;  // flat input index of the first maximum
        double best = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < d.kernel; ++i) {
          for (int64_t j = 0; j < d.kernel; ++j) {
            const int64_t ih = p * d.stride - d.pad + i;
            const int64_t iw = q * d.stride - d.pad + j;
            if (ih < 0 || ih >= d.h || iw < 0 || iw >= d.w) continue;
            const int64_t idx = (nc * d.h + ih) * d.w + iw;
            if (d.kind == PoolKind::kAvg) {
              (*dx)[At(idx)] += g / area;
            } else if (arg < 0 || x[At(idx)] > best) {  // strict: the first maximum wins ties
              best = x[At(idx)];
              arg = idx;
            }
          }
        }
        if (d.kind == PoolKind::kMax && arg >= 0) (*dx)[At(arg)] += g;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// elementwise

void ReluForward(const Vec& x, Vec* y) {
  y->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) (*y)[i] = x[i] > 0.0 ? x[i] : 0.0;
}

void ReluBackward(const Vec& y, const Vec& dy, Vec* dx) {
  CheckSize(dy, static_cast<int64_t>(y.size()), "relu dy");
  dx->resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) (*dx)[i] = y[i] > 0.0 ? dy[i] : 0.0;
}

void ActivationForward(const ew::Activation& f, const Vec& x, Vec* y) {
  const double a = f.a, b = f.b;
  y->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    switch (f.kind) {
      case ew::ActKind::kClip:
        (*y)[i] = std::min(std::max(v, a), b);
        break;
      case ew::ActKind::kSigmoid:
        (*y)[i] = 1.0 / (1.0 + std::exp(-v));
        break;
      case ew::ActKind::kHardSigmoid:
        (*y)[i] = std::min(1.0, std::max(0.0, a * v + b));
        break;
      case ew::ActKind::kHardSwish:
        (*y)[i] = v * std::min(6.0, std::max(0.0, v + 3.0)) / 6.0;
        break;
      case ew::ActKind::kTanh:
        (*y)[i] = std::tanh(v);
        break;
    }
  }
}

void ActivationBackward(const ew::Activation& f, const Vec& x, const Vec& dy, Vec* dx) {
  CheckSize(dy, static_cast<int64_t>(x.size()), "activation dy");
  const double a = f.a, b = f.b;
  dx->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    double g = 0;  // dy/dx
    switch (f.kind) {
      case ew::ActKind::kClip:
        g = v > a && v < b ? 1.0 : 0.0;
        break;
      case ew::ActKind::kSigmoid: {
        const double s = 1.0 / (1.0 + std::exp(-v));
        g = s * (1.0 - s);
        break;
      }
      case ew::ActKind::kHardSigmoid:
        g = a * v + b > 0.0 && a * v + b < 1.0 ? a : 0.0;
        break;
      case ew::ActKind::kHardSwish:
        g = v < -3.0 ? 0.0 : (v <= 3.0 ? (2.0 * v + 3.0) / 6.0 : 1.0);
        break;
      case ew::ActKind::kTanh:
        g = 1.0 - std::tanh(v) * std::tanh(v);
        break;
    }
    (*dx)[i] = g * dy[i];
  }
}

void MulRows(const Vec& x, const Vec& s, Vec* y) {
  DPT_CHECK(!s.empty() && x.size() % s.size() == 0)
      << "mul_rows: " << x.size() << " by " << s.size();
  const size_t cols = x.size() / s.size();
  y->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) (*y)[i] = x[i] * s[i / cols];
}

void RowDot(const Vec& dy, const Vec& x, int64_t rows, Vec* ds) {
  CheckSize(dy, static_cast<int64_t>(x.size()), "row_dot dy");
  DPT_CHECK(rows > 0 && x.size() % At(rows) == 0) << "row_dot: " << x.size() << " in " << rows;
  const size_t cols = x.size() / At(rows);
  ds->assign(At(rows), 0.0);
  for (size_t i = 0; i < x.size(); ++i) (*ds)[i / cols] += dy[i] * x[i];
}

void AddRows(const Vec& x, const Vec& s, Vec* y) {
  DPT_CHECK(!s.empty() && x.size() % s.size() == 0)
      << "add_rows: " << x.size() << " by " << s.size();
  const size_t cols = x.size() / s.size();
  y->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) (*y)[i] = x[i] + s[i / cols];
}

void Pad2d(const Vec& x, int64_t planes, int64_t h, int64_t w, int64_t top, int64_t left,
           int64_t bottom, int64_t right, Vec* y) {
  CheckSize(x, planes * h * w, "pad x");
  const int64_t oh = h + top + bottom, ow = w + left + right;
  y->assign(At(planes * oh * ow), 0.0);
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < h; ++i) {
      for (int64_t j = 0; j < w; ++j) {
        const int64_t oi = i + top, oj = j + left;
        if (oi >= 0 && oi < oh && oj >= 0 && oj < ow) {
          (*y)[At((p * oh + oi) * ow + oj)] = x[At((p * h + i) * w + j)];
        }
      }
    }
  }
}

std::vector<ActivationCase> ActivationCases() {
  using K = ew::ActKind;
  return {
      {"relu6", {K::kClip, 0.f, 6.f}},          {"clip(-1.5,2)", {K::kClip, -1.5f, 2.f}},
      {"sigmoid", {K::kSigmoid, 0.f, 0.f}},     {"hardsigmoid", {K::kHardSigmoid, 1.f / 6.f, 0.5f}},
      {"hardswish", {K::kHardSwish, 0.f, 0.f}}, {"tanh", {K::kTanh, 0.f, 0.f}}};
}

void Add(const Vec& a, const Vec& b, Vec* y) {
  CheckSize(b, static_cast<int64_t>(a.size()), "add b");
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  *y = std::move(out);  // y may alias a or b
}

void Scale(Vec* t, double alpha) {
  for (double& v : *t) v *= alpha;
}

void DropoutForward(const Vec& x, float p, uint64_t seed, Vec* y) {
  const double keep_scale = 1.0 / (1.0 - static_cast<double>(p));
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const bool keep = ew::DropoutScale(seed, i, p) != 0.0f;
    out[i] = keep ? x[i] * keep_scale : 0.0;
  }
  *y = std::move(out);
}

void DropoutBackward(const Vec& dy, float p, uint64_t seed, Vec* dx) {
  DropoutForward(dy, p, seed, dx);  // the same mask and scale: d(x * s_i)/dx = s_i
}

// ---------------------------------------------------------------------------------------------
// batch norm

namespace {
// Index of (n, c, s) in an (N, C, S) buffer.
size_t BnAt(const BatchNormShape& s, int64_t n, int64_t c, int64_t i) {
  return At((n * s.c + c) * s.spatial + i);
}
}  // namespace

void BatchNormForwardTraining(const BatchNormArgs& a, const BatchNormShape& s, const Vec& x,
                              const Vec& gamma, const Vec& beta, Vec* running_mean,
                              Vec* running_var, Vec* y, Vec* save_mean, Vec* save_invstd) {
  CheckSize(x, s.n * s.c * s.spatial, "bn x");
  CheckSize(gamma, s.c, "bn gamma");
  CheckSize(beta, s.c, "bn beta");
  CheckSize(*running_mean, s.c, "bn running_mean");
  CheckSize(*running_var, s.c, "bn running_var");
  const int64_t M = s.count();
  DPT_CHECK(M > 1) << "batch norm training needs more than one value per channel";
  y->assign(x.size(), 0.0);
  save_mean->assign(At(s.c), 0.0);
  save_invstd->assign(At(s.c), 0.0);
  for (int64_t c = 0; c < s.c; ++c) {
    double sum = 0.0;
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) sum += x[BnAt(s, n, c, i)];
    }
    const double mean = sum / static_cast<double>(M);
    double sq = 0.0;  // two-pass variance: no cancellation
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        const double dev = x[BnAt(s, n, c, i)] - mean;
        sq += dev * dev;
      }
    }
    const double var = sq / static_cast<double>(M);
    const double unbiased = sq / static_cast<double>(M - 1);
    const double invstd = 1.0 / std::sqrt(var + a.eps);
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        const size_t idx = BnAt(s, n, c, i);
        (*y)[idx] = gamma[At(c)] * (x[idx] - mean) * invstd + beta[At(c)];
      }
    }
    (*save_mean)[At(c)] = mean;
    (*save_invstd)[At(c)] = invstd;
    (*running_mean)[At(c)] = (1.0 - a.momentum) * (*running_mean)[At(c)] + a.momentum * mean;
    (*running_var)[At(c)] = (1.0 - a.momentum) * (*running_var)[At(c)] + a.momentum * unbiased;
  }
}

void BatchNormForwardInference(const BatchNormArgs& a, const BatchNormShape& s, const Vec& x,
                               const Vec& gamma, const Vec& beta, const Vec& running_mean,
                               const Vec& running_var, Vec* y) {
  CheckSize(x, s.n * s.c * s.spatial, "bn x");
  CheckSize(gamma, s.c, "bn gamma");
  CheckSize(beta, s.c, "bn beta");
  CheckSize(running_mean, s.c, "bn running_mean");
  CheckSize(running_var, s.c, "bn running_var");
  y->assign(x.size(), 0.0);
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.c; ++c) {
      const double invstd = 1.0 / std::sqrt(running_var[At(c)] + a.eps);
      for (int64_t i = 0; i < s.spatial; ++i) {
        const size_t idx = BnAt(s, n, c, i);
        (*y)[idx] = gamma[At(c)] * (x[idx] - running_mean[At(c)]) * invstd + beta[At(c)];
      }
    }
  }
}

void BatchNormBackward(const BatchNormShape& s, const Vec& x, const Vec& dy, const Vec& gamma,
                       const Vec& save_mean, const Vec& save_invstd, Vec* dx, Vec* dgamma,
                       Vec* dbeta, bool accumulate) {
  CheckSize(x, s.n * s.c * s.spatial, "bn x");
  CheckSize(dy, s.n * s.c * s.spatial, "bn dy");
  CheckSize(gamma, s.c, "bn gamma");
  CheckSize(save_mean, s.c, "bn save_mean");
  CheckSize(save_invstd, s.c, "bn save_invstd");
  PrepareGrad(dgamma, s.c, accumulate, "bn dgamma");
  PrepareGrad(dbeta, s.c, accumulate, "bn dbeta");
  dx->assign(x.size(), 0.0);
  const double M = static_cast<double>(s.count());
  for (int64_t c = 0; c < s.c; ++c) {
    const double mean = save_mean[At(c)], invstd = save_invstd[At(c)];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        const size_t idx = BnAt(s, n, c, i);
        sum_dy += dy[idx];
        sum_dy_xhat += dy[idx] * (x[idx] - mean) * invstd;
      }
    }
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        const size_t idx = BnAt(s, n, c, i);
        const double xhat = (x[idx] - mean) * invstd;
        (*dx)[idx] = gamma[At(c)] * invstd / M * (M * dy[idx] - sum_dy - xhat * sum_dy_xhat);
      }
    }
    (*dgamma)[At(c)] += sum_dy_xhat;
    (*dbeta)[At(c)] += sum_dy;
  }
}

// ---------------------------------------------------------------------------------------------
// losses

void SoftmaxCrossEntropy(int64_t n, int64_t k, const Vec& logits,
                         const std::vector<int32_t>& labels, Vec* probs, double* loss_sum,
                         int64_t* correct, double smoothing) {
  CheckSize(logits, n * k, "softmax logits");
  DPT_CHECK(static_cast<int64_t>(labels.size()) == n) << "labels " << labels.size() << " != " << n;
  probs->assign(At(n * k), 0.0);
  *loss_sum = 0.0;
  *correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double* row = logits.data() + i * k;
    int64_t argmax = 0;
    for (int64_t j = 1; j < k; ++j) {
      if (row[j] > row[argmax]) argmax = j;  // strict: ties keep the lowest index
    }
    const double mx = row[argmax];
    double z = 0.0;
    for (int64_t j = 0; j < k; ++j) z += std::exp(row[j] - mx);
    for (int64_t j = 0; j < k; ++j) (*probs)[At(i * k + j)] = std::exp(row[j] - mx) / z;
    const int32_t label = labels[At(i)];
    DPT_CHECK(label >= 0 && label < k) << "label " << label << " out of [0, " << k << ")";
    for (int64_t j = 0; j < k; ++j) {
      const double q = (j == label ? 1.0 - smoothing : 0.0) + smoothing / static_cast<double>(k);
      *loss_sum += q * ((mx + std::log(z)) - row[j]);  // q_j * -log p_j
    }
    if (argmax == label) ++*correct;
  }
}

void SoftmaxCrossEntropyBackward(int64_t n, int64_t k, const Vec& probs,
                                 const std::vector<int32_t>& labels, double scale, Vec* dlogits,
                                 double smoothing) {
  CheckSize(probs, n * k, "softmax probs");
  dlogits->assign(At(n * k), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const double q =
          (j == labels[At(i)] ? 1.0 - smoothing : 0.0) + smoothing / static_cast<double>(k);
      (*dlogits)[At(i * k + j)] = (probs[At(i * k + j)] - q) * scale;
    }
  }
}

double MseLoss(const Vec& y, const Vec& t) {
  CheckSize(t, static_cast<int64_t>(y.size()), "mse t");
  double sum = 0.0;
  for (size_t i = 0; i < y.size(); ++i) sum += (y[i] - t[i]) * (y[i] - t[i]);
  return sum;
}

void MseBackward(const Vec& y, const Vec& t, double scale, Vec* dy) {
  CheckSize(t, static_cast<int64_t>(y.size()), "mse t");
  dy->resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) (*dy)[i] = 2.0 * (y[i] - t[i]) * scale;
}

// ---------------------------------------------------------------------------------------------
// optimizers

void SgdStep(const ew::SgdHyper& h, Vec* param, const Vec& grad, Vec* momentum) {
  CheckSize(grad, static_cast<int64_t>(param->size()), "sgd grad");
  const double lr = h.lr, m = h.momentum, wd = h.weight_decay, gs = h.grad_scale;
  if (m != 0.0) CheckSize(*momentum, static_cast<int64_t>(param->size()), "sgd momentum");
  for (size_t i = 0; i < param->size(); ++i) {
    double& p = (*param)[i];
    double d = grad[i] * gs + wd * p;
    if (m != 0.0) {
      double& buf = (*momentum)[i];
      buf = m * buf + d;
      d = h.nesterov ? d + m * buf : buf;
    }
    p -= lr * d;
  }
}

void AdamWStep(const ew::AdamWHyper& h, Vec* param, const Vec& grad, Vec* m, Vec* v) {
  const int64_t size = static_cast<int64_t>(param->size());
  CheckSize(grad, size, "adamw grad");
  CheckSize(*m, size, "adamw m");
  CheckSize(*v, size, "adamw v");
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  const double bc1 = h.bias_correction1, bc2 = h.bias_correction2, gs = h.grad_scale;
  for (size_t i = 0; i < param->size(); ++i) {
    const double g = grad[i] * gs;
    double& p = (*param)[i];
    p *= 1.0 - lr * wd;  // decoupled weight decay, before the moment update
    (*m)[i] = b1 * (*m)[i] + (1.0 - b1) * g;
    (*v)[i] = b2 * (*v)[i] + (1.0 - b2) * g * g;
    const double mhat = (*m)[i] / bc1;
    const double vhat = (*v)[i] / bc2;
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
}

// ---------------------------------------------------------------------------------------------
// checks

int64_t CountNonFinite(const std::vector<float>& t) {
  int64_t count = 0;
  for (float v : t) {
    if (!std::isfinite(v)) ++count;
  }
  return count;
}

double SumSquares(const Vec& t) {
  double sum = 0.0;
  for (double v : t) sum += v * v;
  return sum;
}

}  // namespace dptrain::ref
