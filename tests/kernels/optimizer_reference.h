// Double-precision references of the optimizer updates and of 8-bit dequantisation, element by
// element, written from the papers' and torch.optim's formulas rather than from the kernels; the
// kernel tests (tests/kernels) and the optimizer tests (tests/optim) both check against these.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "memfit/kernels/cpu/blockwise_quant.h"

namespace memfit::testing {

struct AdamRef {
  double lr, beta1, beta2, eps, wd;
};

// torch.optim.AdamW, one element, t counting from 1.
inline void adamw_ref(double& p, double g, double& m, double& v, const AdamRef& h, int64_t t) {
  p *= 1.0 - h.lr * h.wd;
  m = h.beta1 * m + (1.0 - h.beta1) * g;
  v = h.beta2 * v + (1.0 - h.beta2) * g * g;
  double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
  double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
  p -= h.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + h.eps);
}

struct LionRef {
  double lr, beta1, beta2, wd;
};

// Lion (Chen et al. 2023, Algorithm 2), one element.
inline void lion_ref(double& p, double g, double& m, const LionRef& h) {
  double c = h.beta1 * m + (1.0 - h.beta1) * g;
  double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
  p = p * (1.0 - h.lr * h.wd) - h.lr * sign;
  m = h.beta2 * m + (1.0 - h.beta2) * g;
}

// Adam-mini on one block of n elements sharing v (Zhang et al. 2024, Algorithm 1 with AdamW's
// bias correction and decoupled decay, as the reference implementation).
inline void adam_mini_block_ref(double* p, const double* g, double* m, double& v, int64_t n,
                                const AdamRef& h, int64_t t) {
  double mean_sq = 0;
  for (int64_t i = 0; i < n; ++i) mean_sq += g[i] * g[i];
  mean_sq /= static_cast<double>(n);
  v = h.beta2 * v + (1.0 - h.beta2) * mean_sq;
  double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
  double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
  double denom = std::sqrt(v) / std::sqrt(bc2) + h.eps;
  for (int64_t i = 0; i < n; ++i) {
    p[i] *= 1.0 - h.lr * h.wd;
    m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g[i];
    p[i] -= h.lr / bc1 * m[i] / denom;
  }
}

// values[q[i]] * absmax[block of i], in double.
inline std::vector<double> dequantize_ref(const int8_t* q, const float* absmax, int64_t n,
                                          const kernels::QuantMap& map) {
  std::vector<double> x(n);
  for (int64_t i = 0; i < n; ++i)
    x[i] = static_cast<double>(map.values[static_cast<uint8_t>(q[i])]) *
           absmax[i / kernels::kQuantBlock];
  return x;
}

// Half the widest gap between neighbouring entries: the worst rounding error of a value in
// [-1, 1] (signed) or [0, 1] (unsigned), in units of the block's absmax.
inline double max_half_gap(const kernels::QuantMap& map) {
  double g = 0;
  for (int i = 0; i + 1 < kernels::kQuantCodes; ++i)
    g = std::max(g, (static_cast<double>(map.values[i + 1]) - map.values[i]) / 2.0);
  if (map.is_signed) g = std::max(g, 1.0 + map.values[0]);  // -1 rounds to values[0]
  return g;
}

inline std::vector<float> normal_vector(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

// |actual - expected| <= atol + rtol |expected|, with the index in the failure message.
inline void expect_all_close(const float* actual, const double* expected, int64_t n, double atol,
                             double rtol, const char* what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    double tol = atol + rtol * std::fabs(expected[i]);
    if (!(std::fabs(actual[i] - expected[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "] = " << actual[i] << ", expected " << expected[i]
                    << " (tolerance " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " outside tolerance";
}

}  // namespace memfit::testing
