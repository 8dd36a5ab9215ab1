// SPDX-License-Identifier: Apache-2.0
// Conformance checks shared by the weighted ops (conv2d, linear): forward, backward data and
// backward weights (overwrite or accumulate) on a backend against the double reference, and the
// loop over a suite's cases that skips, in one message, those the backend does not support.
//
// An op plugs in by specialising WeightedOp<Desc> next to its test (conv_test.cc,
// linear_test.cc) with:
//   static Shape X(d), W(d), Y(d); static int64_t Bias(d);        operand shapes, bias length
//   static int64_t ForwardTerms(d), DataTerms(d), WeightTerms(d); summands per output element
//   static std::shared_ptr<OpPlan> Prepare(be, d);
//   static void Forward(be, plan, x, w, b, y), BackwardData(be, plan, dy, w, dx),
//               BackwardWeights(be, plan, x, dy, dw, db, accumulate),
//               Backward(be, plan, x, dy, w, dx, dw, db, accumulate);   (both passes in one)
//   static void RefForward(d, x, w, b, y), RefBackwardData(d, dy, w, dx),
//               RefBackwardWeights(d, x, dy, dw, db, accumulate);       (reference_ops, double)
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "tests/testing/backends.h"
#include "tests/testing/tolerances.h"

namespace dptrain::testing {

template <class Desc>
struct WeightedOp;  // specialised per op, see above

// Input, weight and bias values of one case (fixed seeds: seed, seed + 1, seed + 2).
struct WeightedData {
  std::vector<float> x, w, b;
};

template <class Desc>
WeightedData MakeWeightedData(const Desc& d, uint32_t seed) {
  using Op = WeightedOp<Desc>;
  return {RandomUniform(static_cast<size_t>(Op::X(d).numel()), seed),
          RandomUniform(static_cast<size_t>(Op::W(d).numel()), seed + 1),
          RandomUniform(static_cast<size_t>(Op::Bias(d)), seed + 2)};
}

// Runs forward on `be` and compares with the reference.
template <class Desc>
void CheckForward(Backend& be, const Desc& d, uint32_t seed) {
  using Op = WeightedOp<Desc>;
  SCOPED_TRACE(d.ToString());
  const WeightedData data = MakeWeightedData(d, seed);
  auto plan = Op::Prepare(be, d);
  Tensor x = ToDevice(be, data.x, Op::X(d));
  Tensor w = ToDevice(be, data.w, Op::W(d));
  Tensor b = ToDevice(be, data.b, {Op::Bias(d)});
  Tensor y = be.Empty(Op::Y(d), DType::kF32, "y");
  Op::Forward(be, *plan, x, w, d.bias ? &b : nullptr, &y);

  std::vector<double> ref_y;
  const std::vector<double> ref_b = ToDouble(data.b);
  Op::RefForward(d, ToDouble(data.x), ToDouble(data.w), d.bias ? &ref_b : nullptr, &ref_y);
  EXPECT_TRUE(AllClose(ToHost(be, y), ref_y, ForReduction(d.precision, Op::ForwardTerms(d))));
}

// dx starts as garbage: it must be overwritten.
template <class Desc>
void CheckBackwardData(Backend& be, const Desc& d, uint32_t seed) {
  using Op = WeightedOp<Desc>;
  SCOPED_TRACE(d.ToString());
  const WeightedData data = MakeWeightedData(d, seed);
  const std::vector<float> dy = RandomUniform(static_cast<size_t>(Op::Y(d).numel()), seed + 3);
  auto plan = Op::Prepare(be, d);
  Tensor dy_t = ToDevice(be, dy, Op::Y(d));
  Tensor w = ToDevice(be, data.w, Op::W(d));
  Tensor dx = ToDevice(be, RandomUniform(static_cast<size_t>(Op::X(d).numel()), 99), Op::X(d));
  Op::BackwardData(be, *plan, dy_t, w, &dx);

  std::vector<double> ref_dx;
  Op::RefBackwardData(d, ToDouble(dy), ToDouble(data.w), &ref_dx);
  EXPECT_TRUE(AllClose(ToHost(be, dx), ref_dx, ForReduction(d.precision, Op::DataTerms(d))));
}

// Existing gradient values are added to when accumulating and garbage to overwrite otherwise;
// without bias, db must not be written at all.
template <class Desc>
void CheckBackwardWeights(Backend& be, const Desc& d, uint32_t seed, bool accumulate) {
  using Op = WeightedOp<Desc>;
  SCOPED_TRACE(d.ToString() + (accumulate ? " accumulate" : " overwrite"));
  const WeightedData data = MakeWeightedData(d, seed);
  const std::vector<float> dy = RandomUniform(static_cast<size_t>(Op::Y(d).numel()), seed + 3);
  const std::vector<float> dw0 = RandomUniform(static_cast<size_t>(Op::W(d).numel()), seed + 4);
  const std::vector<float> db0 = RandomUniform(static_cast<size_t>(Op::Bias(d)), seed + 5);
  auto plan = Op::Prepare(be, d);
  Tensor x = ToDevice(be, data.x, Op::X(d));
  Tensor dy_t = ToDevice(be, dy, Op::Y(d));
  Tensor dw = ToDevice(be, dw0, Op::W(d));
  Tensor db = ToDevice(be, db0, {Op::Bias(d)});
  Op::BackwardWeights(be, *plan, x, dy_t, &dw, d.bias ? &db : nullptr, accumulate);

  std::vector<double> ref_dw = ToDouble(dw0), ref_db = ToDouble(db0);
  Op::RefBackwardWeights(d, ToDouble(data.x), ToDouble(dy), &ref_dw, d.bias ? &ref_db : nullptr,
                         accumulate);
  const Tolerance tol = ForReduction(d.precision, Op::WeightTerms(d) + (accumulate ? 1 : 0));
  EXPECT_TRUE(AllClose(ToHost(be, dw), ref_dw, tol)) << "dw";
  if (d.bias) {
    EXPECT_TRUE(AllClose(ToHost(be, db), ref_db, tol)) << "db";
  } else {
    EXPECT_TRUE(AllClose(ToHost(be, db), ToDouble(db0), kExactTol)) << "db written without bias";
  }
}

// The op's both-passes call (what the layer calls; the CPU backend reuses the forward's staged
// copies of x and w and stages dy once for both primitives) gives exactly the two separate
// calls' results, with and without dx, after a forward of these x and w, and after a forward of
// other tensors on the same plan (whose staged copies must not be taken for x's and w's).
template <class Desc>
void CheckBothBackwardPasses(Backend& be, const Desc& d, uint32_t seed) {
  using Op = WeightedOp<Desc>;
  SCOPED_TRACE(d.ToString());
  const WeightedData data = MakeWeightedData(d, seed);
  const WeightedData other = MakeWeightedData(d, seed + 7);
  const std::vector<float> dy = RandomUniform(static_cast<size_t>(Op::Y(d).numel()), seed + 3);
  auto plan = Op::Prepare(be, d);
  Tensor x = ToDevice(be, data.x, Op::X(d));
  Tensor w = ToDevice(be, data.w, Op::W(d));
  Tensor b = ToDevice(be, data.b, {Op::Bias(d)});
  Tensor x_other = ToDevice(be, other.x, Op::X(d));
  Tensor w_other = ToDevice(be, other.w, Op::W(d));
  Tensor y = be.Empty(Op::Y(d), DType::kF32, "y");
  Tensor dy_t = ToDevice(be, dy, Op::Y(d));
  // Gradients start from w's and b's values so that accumulate has something to add to.
  const auto run = [&](bool both, bool with_dx) {
    Tensor dx = be.Zeros(Op::X(d), DType::kF32, "dx");
    Tensor dw = ToDevice(be, data.w, Op::W(d));
    Tensor db = ToDevice(be, data.b, {Op::Bias(d)});
    Tensor* db_p = d.bias ? &db : nullptr;
    if (both) {
      Op::Backward(be, *plan, x, dy_t, w, with_dx ? &dx : nullptr, &dw, db_p, true);
    } else {
      Op::BackwardWeights(be, *plan, x, dy_t, &dw, db_p, true);
      if (with_dx) Op::BackwardData(be, *plan, dy_t, w, &dx);
    }
    return std::vector<std::vector<float>>{ToHost(be, dx), ToHost(be, dw), ToHost(be, db)};
  };
  for (const bool with_dx : {true, false}) {
    for (const bool forwarded_these : {true, false}) {
      Op::Forward(be, *plan, forwarded_these ? x : x_other, forwarded_these ? w : w_other,
                  d.bias ? &b : nullptr, &y);
      const auto both = run(true, with_dx);
      EXPECT_EQ(both, run(false, with_dx))
          << (with_dx ? "with dx" : "without dx")
          << (forwarded_these ? ", after their forward" : ", after other tensors' forward");
    }
  }
}

// Runs check(desc, seed) on every case the backend supports (seeds first_seed + 10, + 20, ...);
// the unsupported ones are listed in one skip message at the end (the supported ones still run
// and can fail).
template <class Desc, class F>
void ForEachSupportedCase(Backend& be, const std::vector<Desc>& cases, uint32_t first_seed,
                          F check) {
  std::string unsupported;
  uint32_t seed = first_seed;
  for (const Desc& d : cases) {
    seed += 10;
    if (!be.Supports(d)) {
      unsupported += " [" + d.ToString() + "]";
      continue;
    }
    check(d, seed);
  }
  if (!unsupported.empty()) GTEST_SKIP() << be.name() << ": unsupported" << unsupported;
}

}  // namespace dptrain::testing
