// Helpers for the matmul and attention tests: seeded random tensors, copies between f32
// tensors and double arrays (the references work in double), and a scaled error measure.
// Own namespace: tests/kernels/test_util.h (another file) may define similar names.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "memfit/memory/tensor.h"

namespace memfit::matmul_test {

// A new f32 tensor filled uniformly from [-scale, scale) by a seeded generator.
inline Tensor random_tensor(MemoryPool& pool, Shape shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(pool, shape, DType::f32, Category::activations, "test");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

inline std::vector<double> random_doubles(int64_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

inline std::vector<double> to_double(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<double>(p, p + t.numel());
}

inline std::vector<double> to_double(const float* p, int64_t n) {
  return std::vector<double>(p, p + n);
}

// max |got - want| / max(max |want|, 1e-30): the error relative to the result's scale, which
// stays meaningful where single elements are near zero.
inline double rel_error(const float* got, const double* want, int64_t n) {
  double err = 0.0, ref = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return err / std::max(ref, 1e-30);
}
inline double rel_error(const Tensor& got, const std::vector<double>& want) {
  return rel_error(got.data<float>(), want.data(), got.numel());
}
inline double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return err / std::max(ref, 1e-30);
}

}  // namespace memfit::matmul_test
