// The AVX-512 exp and tanh against double-precision libm: error in ulps over their whole float
// range, and the special values softmax and GELU rely on (0, +-inf, NaN, underflow to 0).
#include "memfit/kernels/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace memfit::kernels {
namespace {

#if defined(__AVX512F__)

// Runs f on xs 16 at a time.
template <typename F>
std::vector<float> run16(F f, const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  for (size_t i = 0; i < xs.size(); i += 16) {
    const __mmask16 m = vec::tail_mask(static_cast<int64_t>(xs.size() - i));
    _mm512_mask_storeu_ps(out.data() + i, m, f(_mm512_maskz_loadu_ps(m, xs.data() + i)));
  }
  return out;
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
  const std::vector<float> xs = sweep(-87.0f, 88.7f, 200001);
  const std::vector<float> ys = run16([](__m512 x) { return vec::exp(x); }, xs);
  double worst = 0.0;
  float worst_x = 0.0f;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double err = ulp_error(ys[i], std::exp(static_cast<double>(xs[i])));
    if (err > worst) worst = err, worst_x = xs[i];
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
}

TEST(VecMath, ExpSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs = {0.0f, -0.0f, -inf, inf, NAN, -200.0f, 100.0f, -103.0f, 88.72f};
  const std::vector<float> ys = run16([](__m512 x) { return vec::exp(x); }, xs);
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
}

TEST(VecMath, TanhIsWithinTwoUlpEverywhere) {
  std::vector<float> xs = sweep(-10.0f, 10.0f, 200001);
  for (float x = 1e-8f; x < 1.0f; x *= 1.1f) {  // small arguments, where cancellation would bite
    xs.push_back(x);
    xs.push_back(-x);
  }
  const std::vector<float> ys = run16([](__m512 x) { return vec::tanh(x); }, xs);
  double worst = 0.0;
  float worst_x = 0.0f;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == 0.0f) continue;
    const double err = ulp_error(ys[i], std::tanh(static_cast<double>(xs[i])));
    if (err > worst) worst = err, worst_x = xs[i];
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
}

TEST(VecMath, TanhSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> ys =
      run16([](__m512 x) { return vec::tanh(x); }, std::vector<float>{0.0f, inf, -inf, NAN, 50.0f});
  EXPECT_EQ(ys[0], 0.0f);
  EXPECT_EQ(ys[1], 1.0f);
  EXPECT_EQ(ys[2], -1.0f);
  EXPECT_TRUE(std::isnan(ys[3]));
  EXPECT_EQ(ys[4], 1.0f);
}

TEST(VecMath, ReduceAddInDouble) {
  // 2^24 + 1 + ... is not representable in float; the double sum of the lanes keeps the 1s.
  __m512 v = _mm512_set1_ps(1.0f);
  v = _mm512_mask_mov_ps(v, 1, _mm512_set1_ps(16777216.0f));
  EXPECT_EQ(vec::reduce_add_pd(v), 16777216.0 + 15.0);
}

#else

TEST(VecMath, NeedsAvx512) { GTEST_SKIP() << "built without AVX-512 (MEMFIT_NATIVE=OFF)"; }

#endif

}  // namespace
}  // namespace memfit::kernels
