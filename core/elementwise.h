// SPDX-License-Identifier: Apache-2.0
// Elementwise math written once for both backends: every function is `__host__ __device__` when
// compiled by nvcc, so the CPU loops (and the CPU tests) exercise exactly the arithmetic the CUDA
// kernels run. Scalar, branch-light, no library calls beyond <cmath>.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DPT_HD __host__ __device__ __forceinline__
#else
#define DPT_HD inline
#endif

namespace dptrain::ew {

// ---- activations -------------------------------------------------------------------------
DPT_HD float Relu(float x) { return x > 0.f ? x : 0.f; }
// Gradient through ReLU given its output y (y > 0 <=> x > 0).
DPT_HD float ReluGrad(float y, float dy) { return y > 0.f ? dy : 0.f; }

// The other pointwise activations of the standard CNN families (ONNX op in brackets), with
// PyTorch's gradients, including its choices at the kinks: clip passes the gradient only strictly
// inside (lo, hi), as hardtanh/ReLU6; hard sigmoid only where alpha*x + beta is strictly inside
// (0, 1); hard swish uses x/3 + 1/2 on [-3, 3]. The gradient reads the input x (clip, hard
// sigmoid, hard swish) or the output y (sigmoid, tanh).
enum class ActKind : uint8_t {
  kClip,         // min(max(x, a), b) [Clip]; ReLU6 is a = 0, b = 6
  kSigmoid,      // 1 / (1 + exp(-x)) [Sigmoid]
  kHardSigmoid,  // max(0, min(1, a*x + b)) [HardSigmoid]; PyTorch's is a = 1/6, b = 1/2
  kHardSwish,    // x * relu6(x + 3) / 6 [HardSwish]
  kTanh,         // tanh(x) [Tanh]
};
struct Activation {
  ActKind kind = ActKind::kClip;
  float a = 0.f, b = 0.f;  // clip bounds, or hard sigmoid's slope and offset
};
DPT_HD float Activate(Activation f, float x) {
  switch (f.kind) {
    case ActKind::kClip:
      return x < f.a ? f.a : (x > f.b ? f.b : x);
    case ActKind::kSigmoid:
      return 1.f / (1.f + expf(-x));
    case ActKind::kHardSigmoid: {
      const float t = f.a * x + f.b;
      return t < 0.f ? 0.f : (t > 1.f ? 1.f : t);
    }
    case ActKind::kHardSwish: {
      const float t = x + 3.f;
      return x * (t < 0.f ? 0.f : (t > 6.f ? 6.f : t)) / 6.f;
    }
    case ActKind::kTanh:
      return tanhf(x);
  }
  return x;
}
// dL/dx from dL/dy = dy, the input x and the output y.
DPT_HD float ActivateGrad(Activation f, float x, float y, float dy) {
  switch (f.kind) {
    case ActKind::kClip:
      return x > f.a && x < f.b ? dy : 0.f;
    case ActKind::kSigmoid:
      return dy * y * (1.f - y);
    case ActKind::kHardSigmoid: {
      const float t = f.a * x + f.b;
      return t > 0.f && t < 1.f ? dy * f.a : 0.f;
    }
    case ActKind::kHardSwish:
      return x < -3.f ? 0.f : (x <= 3.f ? dy * (x / 3.f + 0.5f) : dy);
    case ActKind::kTanh:
      return dy * (1.f - y * y);
  }
  return dy;
}

// ---- zero padding / cropping of (H, W) planes (Backend::Pad2d) ----
// Element (i, j) of the output plane: the input plane's (i - top, j - left), 0 outside it.
DPT_HD float ShiftedAt(const float* plane, int64_t h, int64_t w, int64_t top, int64_t left,
                       int64_t i, int64_t j) {
  const int64_t ih = i - top, iw = j - left;
  return ih >= 0 && ih < h && iw >= 0 && iw < w ? plane[ih * w + iw] : 0.f;
}

// ---- dropout: a counter-based hash, so backward regenerates the mask instead of storing it ----
DPT_HD uint32_t Hash32(uint64_t seed, uint64_t index) {
  // SplitMix64 finaliser over (seed, index): stateless, identical on host and device.
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z >> 32);
}
DPT_HD float Uniform01(uint64_t seed, uint64_t index) {
  return static_cast<float>(Hash32(seed, index) >> 8) * (1.0f / 16777216.0f);  // [0, 1)
}
// A seed whose hash stream is the stream of `seed` shifted by `offset` elements:
// Hash32(ShiftSeed(s, o), i) == Hash32(s, o + i), because the index enters linearly next to
// seed * kMul and kMul is odd (invertible mod 2^64). Lets each rank draw its slice of the global
// batch's dropout mask without knowing the others.
DPT_HD uint64_t ShiftSeed(uint64_t seed, uint64_t offset) {
  return seed + offset * 0xF1DE83E19937733Dull;  // inverse of 0x9E3779B97F4A7C15 mod 2^64
}
// Inverted dropout: kept elements are scaled by 1/(1-p) so inference is the identity.
DPT_HD float DropoutScale(uint64_t seed, uint64_t index, float p) {
  return Uniform01(seed, index) >= p ? 1.0f / (1.0f - p) : 0.0f;
}
// Element `index` of dropout's output (forward) or input gradient (backward: the same mask).
DPT_HD float Dropout(float x, uint64_t seed, uint64_t index, float p) {
  return x * DropoutScale(seed, index, p);
}

// ---- batch norm, per channel over m = N*H*W elements; statistics in double -----------------
// The reductions (sums over the channel) stay in each backend (OpenMP loops, block sums); what
// they feed is written here once so the CPU reference and the CUDA kernels agree to the bit.
DPT_HD double BnInvStd(double var, double eps) { return 1.0 / sqrt(var + eps); }
// A channel's mean and (biased) variance in one pass: the sums of d = x - shift and of d^2 (in
// double, combined in any fixed order), shift one of the channel's own values, so that d is small
// where the data's mean is large and the variance does not cancel (the CUDA backend's channels-last
// kernels; Welford's update would divide per element, slow on GPUs with few f64 units). The
// variance is clamped at 0.
struct BnMoments {
  double mean, var;
};
DPT_HD BnMoments BnShiftedMoments(double shift, double s1, double s2, double m) {
  const double d = s1 / m;
  const double var = s2 / m - d * d;
  return {shift + d, var > 0 ? var : 0};
}
// y = x * scale + shift folds normalisation and the affine transform (f32, as both backends).
struct BnAffine {
  float scale;
  float shift;
};
DPT_HD BnAffine BnFold(float gamma, float beta, float mean, double invstd) {
  const float scale = gamma * static_cast<float>(invstd);
  return {scale, beta - mean * scale};
}
DPT_HD float BnApply(float x, BnAffine a) { return x * a.scale + a.shift; }
// Running statistics (PyTorch): running = (1 - momentum) * running + momentum * batch, with the
// unbiased (m - 1) batch variance.
DPT_HD double BnUnbiasedVar(double var, int64_t m) {
  return m > 1 ? var * static_cast<double>(m) / static_cast<double>(m - 1) : var;
}
DPT_HD float BnRunning(float running, double batch, double momentum) {
  return static_cast<float>((1 - momentum) * running + momentum * batch);
}
// Backward. The reductions sum f32 terms in double: sum(dy) and sum(dy * (x - mean)), which times
// invstd is sum(dy * xhat). Each element's dx is then f32 arithmetic on per-channel terms folded in
// double (f32 element math runs twice the SIMD lanes of f64 on a CPU, and at full rate on GPUs
// whose f64 units are a small fraction of their f32 ones):
//   dx = gamma * invstd / m * (m * dy - sum(dy) - xhat * sum(dy * xhat))
//      = a * dy + (b * (x - mean) + c)
// with a = gamma * invstd, b = -a * invstd * sum(dy * xhat) / m and c = -a * sum(dy) / m.
DPT_HD float BnDyXc(float dy, float x, float mean) { return dy * (x - mean); }
struct BnDxTerms {
  float a, b, c;
};
// A channel's sums folded: sum(dy * xhat) (dgamma's) and the dx terms.
struct BnGradFolded {
  double sum_dy_xhat;
  BnDxTerms dx;
};
DPT_HD BnGradFolded BnGradFold(float gamma, double invstd, double m, double sum_dy,
                               double sum_dy_xc) {
  const double sum_dy_xhat = sum_dy_xc * invstd;
  const double a = gamma * invstd;
  return {sum_dy_xhat,
          {static_cast<float>(a), static_cast<float>(-a * invstd * sum_dy_xhat / m),
           static_cast<float>(-a * sum_dy / m)}};
}
DPT_HD float BnDx(float dy, float x, float mean, BnDxTerms t) {
  return t.a * dy + (t.b * (x - mean) + t.c);
}
// dgamma = sum(dy * xhat), dbeta = sum(dy), added to the old value when accumulating.
DPT_HD float BnParamGrad(double sum, float old, bool accumulate) {
  return static_cast<float>(sum) + (accumulate ? old : 0.f);
}

// ---- losses ------------------------------------------------------------------------------
// Squared error of one element and its gradient for a mean over `count` elements.
DPT_HD float SquaredError(float y, float t) { return (y - t) * (y - t); }
DPT_HD float MseGrad(float y, float t, float inv_count) { return 2.f * (y - t) * inv_count; }
// Softmax cross-entropy of one row with label smoothing eps (F.cross_entropy's
// label_smoothing): (1 - eps) * -log p_t + eps * mean_j(-log p_j), from log(sum_j exp(x_j - m))
// and the target's and the row's mean x - m (m: the row maximum). eps = 0 is plain
// cross-entropy, bit for bit.
DPT_HD double SoftmaxXentRow(double log_sum, double target, double mean, float eps) {
  return eps > 0.f ? log_sum - (1.0 - eps) * target - eps * mean : log_sum - target;
}
// Its gradient for one of the k logits: (p - ((1 - eps) * onehot + eps / k)) * scale, scale
// being 1 / batch (times the loss scale).
DPT_HD float SoftmaxXentGrad(float prob, bool is_target, float eps, int64_t k, float scale) {
  const float target = (is_target ? 1.f - eps : 0.f) + eps / static_cast<float>(k);
  return (prob - target) * scale;
}

// ---- optimizers (PyTorch semantics; grad_scale turns summed gradients into the mean) -------
struct SgdHyper {
  float lr;
  float momentum;
  float weight_decay;
  float grad_scale;  // 1 / (world size * micro-steps) or loss-scale inverse folded in
  bool nesterov;
};
// torch.optim.SGD: d = g + wd*p; buf = m*buf + d; d = nesterov ? d + m*buf : buf; p -= lr*d.
DPT_HD void SgdUpdate(const SgdHyper& h, float* p, float g, float* buf) {
  float d = g * h.grad_scale + h.weight_decay * *p;
  if (h.momentum != 0.f) {
    *buf = h.momentum * *buf + d;
    d = h.nesterov ? d + h.momentum * *buf : *buf;
  }
  *p -= h.lr * d;
}

struct AdamWHyper {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float grad_scale;
  float bias_correction1;  // 1 - beta1^t
  float bias_correction2;  // 1 - beta2^t
};
// torch.optim.AdamW: p *= 1 - lr*wd; m, v moments; p -= lr * mhat / (sqrt(vhat) + eps).
DPT_HD void AdamWUpdate(const AdamWHyper& h, float* p, float g, float* m, float* v) {
  g *= h.grad_scale;
  *p *= 1.f - h.lr * h.weight_decay;
  *m = h.beta1 * *m + (1.f - h.beta1) * g;
  *v = h.beta2 * *v + (1.f - h.beta2) * g * g;
  const float mhat = *m / h.bias_correction1;
  const float vhat = *v / h.bias_correction2;
  *p -= h.lr * mhat / (sqrtf(vhat) + h.eps);
}

// ---- casts -------------------------------------------------------------------------------
// bf16 is the top half of an IEEE float; round to nearest even, NaN stays NaN.
DPT_HD uint16_t FloatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
DPT_HD float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// IEEE binary16, round to nearest even: |f| >= 65520 becomes infinity (the overflow that fp16
// loss scaling detects), values below 2^-14 become subnormals, NaN stays a (quiet) NaN.
DPT_HD uint16_t FloatToHalf(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (x < 0x38800000u) {                                               // half subnormal or zero
    const uint32_t e = x >> 23;
    if (e < 102u) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24: units of 2^-24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u) != 0u)) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (x >> 13) - (112u << 10);  // exponent rebiased 127 -> 15, 10 mantissa bits
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) ++h;  // a carry bumps the exponent
  return static_cast<uint16_t>(sign | h);
}
DPT_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1fu) {
    x = sign | 0x7f800000u | (m << 13);
  } else if (e != 0u) {
    x = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0u) {
    x = sign;
  } else {  // subnormal: normalise
    e = 113u;
    while ((m & 0x400u) == 0u) {
      m <<= 1;
      --e;
    }
    x = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}
// f rounded to the nearest fp16 value (as a float): what an fp16 tensor would hold.
DPT_HD float RoundToHalf(float f) { return HalfToFloat(FloatToHalf(f)); }

DPT_HD bool IsFinite(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (u & 0x7f800000u) != 0x7f800000u;
}

// Normalisation of one uint8 pixel: (x/255 - mean) / std.
DPT_HD float NormalizePixel(uint8_t x, float mean, float inv_std) {
  return (static_cast<float>(x) * (1.f / 255.f) - mean) * inv_std;
}

}  // namespace dptrain::ew
