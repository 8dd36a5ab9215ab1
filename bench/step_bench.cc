// SPDX-License-Identifier: Apache-2.0
// Google Benchmark of the reference CNN: the full training step (forward, loss, backward, SGD)
// and each primitive alone at the same shapes, for batch 64/256, fp32/bf16, 1/2 threads; and
// batch norm alone at resnet8's shapes.
// bench/run.sh compares the step with the sum of its primitives (the framework's overhead).
//
//   step_bench --benchmark_filter='Step|Prim'   (names: Step/<batch>/<bf16?>/<threads>)
#include <benchmark/benchmark.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/backend_registry.h"
#include "models/loss.h"
#include "models/model.h"
#include "models/zoo/zoo.h"
#include "runtime/optim/optimizer.h"

namespace dptrain {
namespace {

Precision Prec(int64_t bf16) { return bf16 != 0 ? Precision::kBF16 : Precision::kF32; }

Tensor Random(Backend& be, const Shape& s, float scale = 1.f) {
  Tensor t = be.Empty(s, DType::kF32, "bench");
  float* p = t.data<float>();
  uint32_t x = 12345;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = scale * (static_cast<float>(x >> 8) / 16777216.f - 0.5f);
  }
  return t;
}

// oneDNN splits a primitive's work for the thread count it was created under, and the backend
// caches plans by shape: without dropping them, the 2-thread benchmarks reused the 1-thread
// runs' plans and ran on one thread.
void UseThreads(Backend& be, int threads) {
  be.SetThreads(threads);
  be.ReleasePlans();
}

void Step(benchmark::State& state) {
  const int64_t batch = state.range(0);
  Backend& be = GetBackend("cpu");
  UseThreads(be, static_cast<int>(state.range(2)));
  Model m(be, BuildZooModel(be, "ref_cnn", 10), Shape{1, 28, 28});
  m.Setup(batch, Prec(state.range(1)));
  m.InitParams(1);
  Loss loss(be, LossKind::kCrossEntropy, m.output_shape());
  OptimizerConfig oc;
  oc.weight_decay = 5e-4;
  Optimizer opt(be, oc, m.params());
  Tensor x = Random(be, Shape{batch, 1, 28, 28});
  Tensor y = be.Empty(Shape{batch}, DType::kI32, "labels");
  for (int64_t i = 0; i < batch; ++i) y.data<int32_t>()[i] = static_cast<int32_t>(i % 10);
  ForwardContext ctx;
  ctx.training = true;
  auto one_step = [&] {
    const Tensor& out = m.Forward(x, ctx);
    loss.Forward(out, y);
    const Tensor& dout = loss.Backward(out, y, batch);
    m.Backward(dout, false);
    opt.Step(&m.params(), m.grads(), 0.01f, 1.f);
    be.Synchronize();
  };
  for (auto _ : state) one_step();
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
  // The same step again with per-op timing: the time spent inside backend ops, in place (with
  // the cache state of a real step). step - ops = what the framework itself costs.
  be.ResetProfile();
  be.EnableProfiling(true);
  constexpr int kProfiled = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kProfiled; ++i) one_step();
  const double step_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kProfiled;
  be.EnableProfiling(false);
  double ops_s = 0;
  for (const auto& op : be.Profile()) ops_s += op.seconds / kProfiled;
  state.counters["ops_ms"] = 1e3 * ops_s;
  state.counters["overhead_pct"] = 100.0 * (step_s - ops_s) / step_s;
}

// Every primitive of one ref_cnn step, one benchmark each (same shapes as the step).
enum Prim : int64_t {
  kConv1Fwd,
  kConv1BwdW,
  kRelu1Fwd,
  kRelu1Bwd,
  kPool1Fwd,
  kPool1Bwd,
  kConv2Fwd,
  kConv2BwdD,
  kConv2BwdW,
  kRelu2Fwd,
  kRelu2Bwd,
  kPool2Fwd,
  kPool2Bwd,
  kFc1Fwd,
  kFc1BwdD,
  kFc1BwdW,
  kRelu3Fwd,
  kRelu3Bwd,
  kFc2Fwd,
  kFc2BwdD,
  kFc2BwdW,
  kLossFwd,
  kLossBwd,
  kSgd,
  kNumPrims
};
const char* kPrimNames[] = {"conv1_fwd", "conv1_bwd_w", "relu1_fwd",   "relu1_bwd",   "pool1_fwd",
                            "pool1_bwd", "conv2_fwd",   "conv2_bwd_d", "conv2_bwd_w", "relu2_fwd",
                            "relu2_bwd", "pool2_fwd",   "pool2_bwd",   "fc1_fwd",     "fc1_bwd_d",
                            "fc1_bwd_w", "relu3_fwd",   "relu3_bwd",   "fc2_fwd",     "fc2_bwd_d",
                            "fc2_bwd_w", "loss_fwd",    "loss_bwd",    "sgd"};

void Primitive(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Precision pr = Prec(state.range(1));
  Backend& be = GetBackend("cpu");
  UseThreads(be, static_cast<int>(state.range(2)));
  const auto prim = static_cast<Prim>(state.range(3));
  state.SetLabel(kPrimNames[prim]);
  const Conv2dDesc c1{n, 1, 28, 28, 32, 3, 3, 1, 1, true, pr};
  const Conv2dDesc c2{n, 32, 14, 14, 64, 3, 3, 1, 1, true, pr};
  const PoolDesc p1{PoolKind::kMax, n, 32, 28, 28, 2, 2, 0};
  const PoolDesc p2{PoolKind::kMax, n, 64, 14, 14, 2, 2, 0};
  const LinearDesc f1{n, 3136, 128, true, pr};
  const LinearDesc f2{n, 128, 10, true, pr};
  std::function<void()> run;
  // Tensors live as long as `run`.
  std::vector<Tensor> keep;
  auto T = [&](const Shape& s) {
    keep.push_back(Random(be, s));
    return keep.back();
  };
  switch (prim) {
    case kConv1Fwd:
    case kConv1BwdW:
    case kConv2Fwd:
    case kConv2BwdD:
    case kConv2BwdW: {
      const bool first = prim == kConv1Fwd || prim == kConv1BwdW;
      const Conv2dDesc& d = first ? c1 : c2;
      auto plan = be.PrepareConv2d(d);
      Tensor x = T(Shape{n, d.c, d.h, d.w}), w = T(Shape{d.k, d.c, 3, 3}), b = T(Shape{d.k});
      Tensor y = T(Shape{n, d.k, d.out_h(), d.out_w()});
      Tensor dw = T(w.shape()), db = T(b.shape()), dx = T(x.shape());
      if (prim == kConv1Fwd || prim == kConv2Fwd) {
        run = [&be, plan, x, w, b, y]() mutable { be.Conv2dForward(*plan, x, w, &b, &y); };
      } else if (prim == kConv2BwdD) {
        run = [&be, plan, y, w, dx]() mutable { be.Conv2dBackwardData(*plan, y, w, &dx); };
      } else {
        run = [&be, plan, x, y, dw, db]() mutable {
          be.Conv2dBackwardWeights(*plan, x, y, &dw, &db, false);
        };
      }
      break;
    }
    case kRelu1Fwd:
    case kRelu1Bwd:
    case kRelu2Fwd:
    case kRelu2Bwd:
    case kRelu3Fwd:
    case kRelu3Bwd: {
      const Shape s = prim <= kRelu1Bwd   ? Shape{n, 32, 28, 28}
                      : prim <= kRelu2Bwd ? Shape{n, 64, 14, 14}
                                          : Shape{n, 128};
      Tensor x = T(s), y = T(s), dx = T(s);
      const bool fwd = prim == kRelu1Fwd || prim == kRelu2Fwd || prim == kRelu3Fwd;
      if (fwd) {
        run = [&be, x, y]() mutable { be.ReluForward(x, &y); };
      } else {
        run = [&be, x, y, dx]() mutable { be.ReluBackward(x, y, &dx); };
      }
      break;
    }
    case kPool1Fwd:
    case kPool1Bwd:
    case kPool2Fwd:
    case kPool2Bwd: {
      const PoolDesc& d = prim <= kPool1Bwd ? p1 : p2;
      auto plan = be.PreparePool(d);
      Tensor x = T(Shape{n, d.c, d.h, d.w}), y = T(Shape{n, d.c, d.out_h(), d.out_w()});
      Tensor ws = be.Empty(Shape{static_cast<int64_t>(plan->workspace_bytes)}, DType::kU8, "ws");
      keep.push_back(ws);
      be.PoolForward(*plan, x, &y, &ws);
      if (prim == kPool1Fwd || prim == kPool2Fwd) {
        run = [&be, plan, x, y, ws]() mutable { be.PoolForward(*plan, x, &y, &ws); };
      } else {
        run = [&be, plan, x, y, ws]() mutable { be.PoolBackward(*plan, y, &ws, &x); };
      }
      break;
    }
    case kFc1Fwd:
    case kFc1BwdD:
    case kFc1BwdW:
    case kFc2Fwd:
    case kFc2BwdD:
    case kFc2BwdW: {
      const LinearDesc& d = prim <= kFc1BwdW ? f1 : f2;
      auto plan = be.PrepareLinear(d);
      Tensor x = T(Shape{n, d.in}), w = T(Shape{d.out, d.in}), b = T(Shape{d.out});
      Tensor y = T(Shape{n, d.out}), dw = T(w.shape()), db = T(b.shape()), dx = T(x.shape());
      if (prim == kFc1Fwd || prim == kFc2Fwd) {
        run = [&be, plan, x, w, b, y]() mutable { be.LinearForward(*plan, x, w, &b, &y); };
      } else if (prim == kFc1BwdD || prim == kFc2BwdD) {
        run = [&be, plan, y, w, dx]() mutable { be.LinearBackwardData(*plan, y, w, &dx); };
      } else {
        run = [&be, plan, x, y, dw, db]() mutable {
          be.LinearBackwardWeights(*plan, x, y, &dw, &db, false);
        };
      }
      break;
    }
    case kLossFwd:
    case kLossBwd: {
      Tensor logits = T(Shape{n, 10}), probs = T(Shape{n, 10}), l = T(Shape{1}), c = T(Shape{1});
      Tensor labels = be.Zeros(Shape{n}, DType::kI32, "labels");
      keep.push_back(labels);
      if (prim == kLossFwd) {
        run = [&be, logits, labels, probs, l, c]() mutable {
          be.SoftmaxCrossEntropy(logits, labels, 0.f, &probs, &l, &c);
        };
      } else {
        run = [&be, probs, labels, logits]() mutable {
          be.SoftmaxCrossEntropyBackward(probs, labels, 0.f, 0.01f, &logits);
        };
      }
      break;
    }
    case kSgd: {
      // The flat buffer of ref_cnn (421,642 parameters, padded).
      Tensor p = T(Shape{421888}), g = T(Shape{421888}), m = T(Shape{421888});
      run = [&be, p, g, m]() mutable {
        be.SgdStep(ew::SgdHyper{0.01f, 0.9f, 5e-4f, 1.f, false}, &p, g, &m);
      };
      break;
    }
    case kNumPrims:
      break;
  }
  for (auto _ : state) {
    run();
    be.Synchronize();
  }
}

void StepArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "bf16", "threads"});
  for (int64_t batch : {64, 256}) {
    for (int64_t bf16 : {0, 1}) {
      for (int64_t threads : {1, 2}) b->Args({batch, bf16, threads});
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
}

void PrimArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "bf16", "threads", "prim"});
  for (int64_t batch : {64, 256}) {
    for (int64_t bf16 : {0, 1}) {
      for (int64_t threads : {1, 2}) {
        for (int64_t p = 0; p < kNumPrims; ++p) {
          b->Args({batch, bf16, threads, p});
        }
      }
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.1);
}

// Batch norm alone at resnet8's shapes (batch 64, channels-last, 32x32 x 16, 16x16 x 32, 8x8 x 64),
// training forward or backward, with or without the folded ReLU, dx in f32 or bf16, x in f32 or
// bf16 (a bf16 convolution's output, BatchNormArgs::x_bf16).
void BatchNorm(benchmark::State& state) {
  const int64_t c = state.range(0), hw = 32 / (c / 16);
  const bool backward = state.range(1) != 0;
  BatchNormArgs a;
  a.nhwc = true;
  a.relu = state.range(2) != 0;
  a.dx_bf16 = state.range(3) != 0;
  a.x_bf16 = state.range(5) != 0;
  Backend& be = GetBackend("cpu");
  UseThreads(be, static_cast<int>(state.range(4)));
  const Shape s{64, c, hw, hw};
  Tensor x = Random(be, s), y = Random(be, s), dy = Random(be, s);
  if (a.x_bf16) {  // x's values truncated to bf16
    Tensor x16 = be.Empty(s, DType::kBF16, "x");
    for (int64_t i = 0; i < s.numel(); ++i) {
      static_cast<uint16_t*>(x16.raw())[i] =
          static_cast<uint16_t>(std::bit_cast<uint32_t>(x.data<float>()[i]) >> 16);
    }
    x = x16;
  }
  Tensor gamma = Random(be, Shape{c}), beta = Random(be, Shape{c}), rm = Random(be, Shape{c});
  Tensor rv = be.Empty(Shape{c}, DType::kF32, "rv"), mean = be.Empty(Shape{c}, DType::kF32, "m");
  Tensor invstd = be.Empty(Shape{c}, DType::kF32, "is");
  Tensor dgamma = be.Empty(Shape{c}, DType::kF32, "dg"),
         dbeta = be.Empty(Shape{c}, DType::kF32, "db");
  Tensor dx = be.Empty(s, a.dx_bf16 ? DType::kBF16 : DType::kF32, "dx");
  for (int64_t j = 0; j < c; ++j) rv.data<float>()[j] = 1.f;
  be.BatchNormForwardTraining(a, x, gamma, beta, &rm, &rv, &y, &mean, &invstd);
  for (auto _ : state) {
    if (backward) {
      be.BatchNormBackward(a, x, dy, a.relu ? &y : nullptr, gamma, beta, mean, invstd, &dx, &dgamma,
                           &dbeta, false);
    } else {
      be.BatchNormForwardTraining(a, x, gamma, beta, &rm, &rv, &y, &mean, &invstd);
    }
    be.Synchronize();
  }
}

void BatchNormArgsList(benchmark::internal::Benchmark* b) {
  b->ArgNames({"c", "bwd", "relu", "dx_bf16", "threads", "x_bf16"});
  for (int64_t c : {16, 32, 64}) {
    for (int64_t threads : {1, 2}) {
      for (int64_t x16 : {0, 1}) {
        b->Args({c, 0, 1, 0, threads, x16});
        for (int64_t relu : {0, 1}) {
          for (int64_t bf16 : {0, 1}) b->Args({c, 1, relu, bf16, threads, x16});
        }
      }
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.2);
}

// Max pooling alone, channels-last, training forward or backward (dx in f32 or bf16): ref_cnn's
// second pool (batch 256, 14x14 x 64, 2x2 stride 2) and a torchvision ResNet's stem pool (batch
// 64, 56x56 x 64 from 112x112, 3x3 stride 2 pad 1: overlapping windows).
void MaxPool(benchmark::State& state) {
  const bool stem = state.range(0) != 0;
  PoolDesc d = stem ? PoolDesc{PoolKind::kMax, 64, 64, 112, 112, 3, 2, 1}
                    : PoolDesc{PoolKind::kMax, 256, 64, 14, 14, 2, 2, 0};
  d.nhwc = true;
  d.dx_bf16 = state.range(2) != 0;
  const bool backward = state.range(1) != 0;
  Backend& be = GetBackend("cpu");
  UseThreads(be, static_cast<int>(state.range(3)));
  if (!be.Supports(d)) return state.SkipWithError("unsupported here");
  const Shape xs{d.n, d.c, d.h, d.w}, ys{d.n, d.c, d.out_h(), d.out_w()};
  Tensor x = Random(be, xs), y = Random(be, ys), dy = Random(be, ys);
  Tensor dx = be.Empty(xs, d.dx_bf16 ? DType::kBF16 : DType::kF32, "dx");
  const auto plan = be.PreparePool(d);
  Tensor ws = be.Empty(Shape{static_cast<int64_t>(plan->workspace_bytes)}, DType::kU8, "ws");
  be.PoolForward(*plan, x, &y, &ws);
  for (auto _ : state) {
    if (backward) {
      be.PoolBackward(*plan, dy, &ws, &dx);
    } else {
      be.PoolForward(*plan, x, &y, &ws);
    }
    be.Synchronize();
  }
}

void MaxPoolArgsList(benchmark::internal::Benchmark* b) {
  b->ArgNames({"stem", "bwd", "dx_bf16", "threads"});
  for (int64_t stem : {0, 1}) {
    for (int64_t threads : {1, 2}) {
      b->Args({stem, 0, 0, threads});
      b->Args({stem, 1, 0, threads});
      if (stem == 0) b->Args({stem, 1, 1, threads});
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.2);
}

// ref_cnn's first layer as the one fused op (ConvPoolDesc: conv 1 -> 32, 3x3 pad 1, ReLU, 2x2 max
// pool, channels-last out), training forward or backward (weight and bias gradients), with its
// GFLOP/s counted as the profile counts them (the full-size convolution's multiply-adds).
void ConvPool(benchmark::State& state) {
  const int64_t n = state.range(0);
  const bool backward = state.range(2) != 0;
  ConvPoolDesc d;
  d.conv = Conv2dDesc{n, 1, 28, 28, 32, 3, 3, 1, 1, true, Prec(state.range(1))};
  d.conv.relu = true, d.conv.x_nhwc = true, d.conv.y_nhwc = true;
  d.pool = PoolDesc{PoolKind::kMax, n, 32, 28, 28, 2, 2, 0};
  d.pool.nhwc = true;
  Backend& be = GetBackend("cpu");
  UseThreads(be, static_cast<int>(state.range(3)));
  if (!be.Supports(d)) return state.SkipWithError("unsupported here");
  const Shape ys{n, 32, 14, 14};
  Tensor x = Random(be, Shape{n, 1, 28, 28}), w = Random(be, Shape{32, 1, 3, 3});
  Tensor b = Random(be, Shape{32}), y = Random(be, ys), dy = Random(be, ys);
  Tensor dw = Random(be, w.shape()), db = Random(be, b.shape());
  Tensor ws = be.Empty(ys, DType::kU8, "ws");
  be.ConvPoolForward(d, x, w, &b, &y, &ws);
  for (auto _ : state) {
    if (backward) {
      be.ConvPoolBackward(d, x, y, dy, ws, &dw, &db, false);
    } else {
      be.ConvPoolForward(d, x, w, &b, &y, &ws);
    }
    be.Synchronize();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(d.conv.flops()) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void ConvPoolArgsList(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "bf16", "bwd", "threads"});
  for (int64_t batch : {64, 256}) {
    for (int64_t bf16 : {0, 1}) {
      for (int64_t bwd : {0, 1}) {
        for (int64_t threads : {1, 2}) b->Args({batch, bf16, bwd, threads});
      }
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.2);
}

// ref_cnn's conv2 (32 -> 64 channels, 3x3 pad 1, bias, 14 x 14) as the step runs it,
// channels-last on both sides, f32 x and dy: the weight and bias gradients alone, whichever way
// the CPU backend plans them (with bf16: AMX tiles or AVX512-BF16 dot products where there are,
// else oneDNN's kernel).
void Conv2Weights(benchmark::State& state) {
  const int64_t n = state.range(0);
  Conv2dDesc d{n, 32, 14, 14, 64, 3, 3, 1, 1, true, Prec(state.range(1))};
  d.x_nhwc = d.y_nhwc = true;
  Backend& be = GetBackend("cpu");
  UseThreads(be, static_cast<int>(state.range(2)));
  if (!be.Supports(d)) return state.SkipWithError("unsupported here");
  const auto plan = be.PrepareConv2d(d);
  Tensor x = Random(be, Shape{n, 14, 14, 32}), dy = Random(be, Shape{n, 14, 14, 64});
  Tensor dw = Random(be, Shape{64, 32, 3, 3}), db = Random(be, Shape{64});
  for (auto _ : state) {
    be.Conv2dBackwardWeights(*plan, x, dy, &dw, &db, false);
    be.Synchronize();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(d.flops()) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void Conv2WeightsArgsList(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "bf16", "threads"});
  for (int64_t batch : {64, 256}) {
    for (int64_t bf16 : {0, 1}) {
      for (int64_t threads : {1, 2}) b->Args({batch, bf16, threads});
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.2);
}

BENCHMARK(Step)->Apply(StepArgs);
BENCHMARK(Primitive)->Apply(PrimArgs);
BENCHMARK(BatchNorm)->Apply(BatchNormArgsList);
BENCHMARK(MaxPool)->Apply(MaxPoolArgsList);
BENCHMARK(ConvPool)->Apply(ConvPoolArgsList);
BENCHMARK(Conv2Weights)->Apply(Conv2WeightsArgsList);

}  // namespace
}  // namespace dptrain

BENCHMARK_MAIN();
