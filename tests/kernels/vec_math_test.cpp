// simd-inl.h's vector exp, exp2 and tanh against double-precision libm: error in ulps over
// their whole float range, and the special values softmax and GELU rely on (0, +-inf, NaN,
// underflow to 0), on every SIMD target this CPU supports (looped in-process).
#include <gtest/gtest.h>
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
namespace {

using MathFn = void (*)(const float*, float*, int64_t);

std::vector<float> run(MathFn f, const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  f(xs.data(), out.data(), static_cast<int64_t>(xs.size()));
  return out;
}

// Runs body once per Highway target this CPU supports (under the cap), naming it on failure.
template <typename Body>
void for_each_target(Body body) {
  simd_target();  // applies the cap first
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(hwy::TargetName(t));
    body();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// |got - exact| in units of the float spacing at exact (normal range only).
double ulp_error(float got, double exact) {
  const float e = static_cast<float>(exact);
  const double ulp = std::nextafter(std::abs(e), INFINITY) - std::abs(e);
  return std::abs(static_cast<double>(got) - exact) / ulp;
}

std::vector<float> sweep(float lo, float hi, int n) {
  std::vector<float> xs(n);
  for (int i = 0; i < n; ++i) xs[i] = lo + (hi - lo) * static_cast<float>(i) / (n - 1);
  return xs;
}

TEST(VecMath, ExpIsWithinTwoUlpOverTheNormalRange) {
  for_each_target([] {
  const std::vector<float> xs = sweep(-87.0f, 88.7f, 200001);
  const std::vector<float> ys = run(simd_test::exp_n, xs);
  double worst = 0.0;
  float worst_x = 0.0f;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double err = ulp_error(ys[i], std::exp(static_cast<double>(xs[i])));
    if (err > worst) worst = err, worst_x = xs[i];
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  });
}

TEST(VecMath, ExpSpecialValues) {
  for_each_target([] {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs = {0.0f, -0.0f, -inf, inf, NAN, -200.0f, 100.0f, -103.0f, 88.72f};
  const std::vector<float> ys = run(simd_test::exp_n, xs);
  EXPECT_EQ(ys[0], 1.0f);
  EXPECT_EQ(ys[1], 1.0f);
  EXPECT_EQ(ys[2], 0.0f);
  EXPECT_EQ(ys[3], inf);
  EXPECT_TRUE(std::isnan(ys[4]));
  EXPECT_EQ(ys[5], 0.0f);
  EXPECT_EQ(ys[6], inf);
  // Subnormal results: within one subnormal step of the truth.
  EXPECT_NEAR(ys[7], std::exp(-103.0), 1.5e-45);
  EXPECT_NEAR(ys[8] / std::exp(static_cast<double>(88.72f)), 1.0, 2e-7);
  });
}

TEST(VecMath, Exp2IsWithinItsBound) {
  for_each_target([] {
    const std::vector<float> xs = sweep(-99.0f, 20.0f, 100001);
    const std::vector<float> ys = run(simd_test::exp2_n, xs);
    double worst = 0.0;
    for (size_t i = 0; i < xs.size(); ++i)
      worst = std::max(worst, std::abs(ys[i] / std::exp2(static_cast<double>(xs[i])) - 1.0));
    EXPECT_LE(worst, 3e-7);
    const std::vector<float> floor = run(simd_test::exp2_n, {-1000.0f, 0.0f});
    EXPECT_EQ(floor[0], std::exp2(-100.0f));
    EXPECT_EQ(floor[1], 1.0f);
  });
}

TEST(VecMath, TanhIsWithinTwoUlpEverywhere) {
  for_each_target([] {
  std::vector<float> xs = sweep(-10.0f, 10.0f, 200001);
  for (float x = 1e-8f; x < 1.0f; x *= 1.1f) {  // small arguments, where cancellation would bite
    xs.push_back(x);
    xs.push_back(-x);
  }
  const std::vector<float> ys = run(simd_test::tanh_n, xs);
  double worst = 0.0;
  float worst_x = 0.0f;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == 0.0f) continue;
    const double err = ulp_error(ys[i], std::tanh(static_cast<double>(xs[i])));
    if (err > worst) worst = err, worst_x = xs[i];
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  });
}

TEST(VecMath, TanhSpecialValues) {
  for_each_target([] {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> ys =
      run(simd_test::tanh_n, std::vector<float>{0.0f, inf, -inf, NAN, 50.0f});
  EXPECT_EQ(ys[0], 0.0f);
  EXPECT_EQ(ys[1], 1.0f);
  EXPECT_EQ(ys[2], -1.0f);
  EXPECT_TRUE(std::isnan(ys[3]));
  EXPECT_EQ(ys[4], 1.0f);
  });
}

TEST(VecMath, ReduceAddInDouble) {
  for_each_target([] {
    // 2^24 + 1 + ... is not representable in float; the double sum of the lanes keeps the 1s.
    std::vector<float> v(16, 1.0f);
    v[0] = 16777216.0f;
    EXPECT_EQ(simd_test::sum_lanes_pd(v.data()),
              16777216.0 + static_cast<double>(simd_test::lanes() - 1));
  });
}

}  // namespace
}  // namespace memfit::kernels
