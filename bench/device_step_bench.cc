// SPDX-License-Identifier: Apache-2.0
// A zoo model's training step (forward, loss, backward, SGD) with the host's work removed: the
// batch is on the device before the first step and nothing synchronises between steps, so the
// host queues steps ahead and the device runs them back to back. Its time per step is what the
// device needs; bench/gpu.sh compares it with `dptrain train`'s profiled step on the same model to
// report the GPU's idle time within a step (issue 65, item 5): 1 - device step / training step.
// Runs on any backend (the CPU's is for the smoke test in ctest).
//
//   device_step_bench --model resnet50 --batch 64 [--precision fp32|tf32|bf16|fp16]
//                     [--device cuda] [--steps 40] [--warmup 10]
// prints one line: "device_step model M batch B precision P device D step_ms T samples_per_s S".
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "core/backend_registry.h"
#include "core/error.h"
#include "models/loss.h"
#include "models/model.h"
#include "models/zoo/zoo.h"
#include "runtime/optim/optimizer.h"

namespace dptrain {
namespace {

struct Args {
  std::string model = "resnet18_cifar", precision = "fp32", device = "cuda";
  int64_t batch = 256, steps = 40, warmup = 10;
};

int Usage(const char* why) {
  std::fprintf(stderr,
               "device_step_bench: %s\nusage: device_step_bench --model NAME --batch N "
               "[--precision fp32|tf32|bf16|fp16] [--device cuda|cpu] [--steps N] [--warmup N]\n",
               why);
  return 2;
}

int Run(const Args& a) {
  Backend& be = GetBackend(a.device);
  // tf32: fp32 with TF32 convolutions (train.tf32, the default of a run); fp32: strict.
  be.SetTf32(a.precision == "tf32");
  const Precision p = a.precision == "bf16"   ? Precision::kBF16
                      : a.precision == "fp16" ? Precision::kF16
                                              : Precision::kF32;
  constexpr int64_t kClasses = 10;
  const Shape in = DefaultInputShape(a.model);
  Model m(be, BuildZooModel(be, a.model, kClasses), in);
  m.Setup(a.batch, p);
  m.InitParams(1);
  Loss loss(be, LossKind::kCrossEntropy, m.output_shape());
  OptimizerConfig oc;
  oc.momentum = 0.9;
  oc.weight_decay = 5e-4;
  Optimizer opt(be, oc, m.params());
  std::vector<int64_t> dims{a.batch};
  for (int64_t d : in.dims()) dims.push_back(d);
  const Shape xs(dims);
  std::vector<float> xv(static_cast<size_t>(xs.numel()));
  uint32_t r = 12345;
  for (float& v : xv) {
    r = r * 1664525u + 1013904223u;
    v = static_cast<float>(r >> 8) / 16777216.f - 0.5f;
  }
  Tensor x = be.Empty(xs, DType::kF32, "bench input");
  be.CopyFromHost(xv.data(), &x);
  std::vector<int32_t> yv(static_cast<size_t>(a.batch));
  for (size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<int32_t>(i % kClasses);
  Tensor y = be.Empty(Shape{a.batch}, DType::kI32, "bench labels");
  be.CopyFromHost(yv.data(), &y);
  ForwardContext ctx;
  ctx.training = true;
  const auto step = [&] {
    const Tensor& out = m.Forward(x, ctx);
    loss.Forward(out, y);
    const Tensor& dout = loss.Backward(out, y, a.batch);
    m.Backward(dout, false);
    opt.Step(&m.params(), m.grads(), 0.01f, 1.f);
  };
  for (int64_t i = 0; i < a.warmup; ++i) step();
  be.Synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < a.steps; ++i) step();
  be.Synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                   static_cast<double>(a.steps);
  std::printf(
      "device_step model %s batch %lld precision %s device %s step_ms %.3f samples_per_s %.1f\n",
      a.model.c_str(), static_cast<long long>(a.batch), a.precision.c_str(), a.device.c_str(),
      1e3 * s, static_cast<double>(a.batch) / s);
  return 0;
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
  dptrain::Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) return dptrain::Usage(("missing the value of " + k).c_str());
    const std::string v = argv[++i];
    char* end = nullptr;
    const auto number = [&](int64_t* out) {
      *out = std::strtoll(v.c_str(), &end, 10);
      return end != v.c_str() && *end == '\0' && *out > 0;
    };
    if (k == "--model") {
      a.model = v;
    } else if (k == "--precision") {
      if (v != "fp32" && v != "tf32" && v != "bf16" && v != "fp16") {
        return dptrain::Usage("--precision is fp32, tf32, bf16 or fp16");
      }
      a.precision = v;
    } else if (k == "--device") {
      a.device = v;
    } else if (k == "--batch" || k == "--steps" || k == "--warmup") {
      int64_t* out = k == "--batch" ? &a.batch : k == "--steps" ? &a.steps : &a.warmup;
      if (!number(out)) return dptrain::Usage((k + " takes a positive integer").c_str());
    } else {
      return dptrain::Usage(("unknown argument " + k).c_str());
    }
  }
  try {
    return dptrain::Run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_step_bench: %s\n", e.what());
    return 1;
  }
}
