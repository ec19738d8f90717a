// Helpers shared by the kernel tests: seeded random fills, copies between f32 tensors and double
// vectors (so the double references can run on exactly the values the fast kernel saw),
// tolerance comparisons that name the worst element, central-difference gradients, and a check
// that a call throws a given error type with given words in its message.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "memfit/memory/tensor.h"

namespace memfit::kernels::test {

inline Tensor make_tensor(MemoryPool& pool, Shape shape, DType dtype = DType::f32) {
  return Tensor::empty(pool, shape, dtype, Category::activations, "test");
}

// Uniform values in [lo, hi), reproducible from the seed, rounded to float so that a copy into
// an f32 tensor holds them exactly.
inline std::vector<double> random_values(size_t n, uint32_t seed, double lo = -1.0,
                                         double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<float>(dist(gen));
  return v;
}

inline std::vector<int32_t> random_ids(size_t n, uint32_t seed, int32_t bound) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, bound - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// Rounds every value to float, so that the reference sees exactly what an f32 tensor holds.
inline void round_to_float(std::vector<double>& v) {
  for (double& x : v) x = static_cast<float>(x);
}

inline void copy_in(Tensor& t, const std::vector<double>& v) {
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  float* p = t.data<float>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<float>(v[i]);
}

inline void copy_in(Tensor& t, const std::vector<int32_t>& v) {
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  int32_t* p = t.data<int32_t>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
}

inline std::vector<double> to_doubles(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<double>(p, p + t.numel());
}

// A new f32 tensor filled with uniform random values; `values` receives them as doubles.
inline Tensor random_tensor(MemoryPool& pool, Shape shape, uint32_t seed,
                            std::vector<double>* values = nullptr, double lo = -1.0,
                            double hi = 1.0) {
  Tensor t = make_tensor(pool, shape);
  std::vector<double> v = random_values(static_cast<size_t>(shape.numel()), seed, lo, hi);
  copy_in(t, v);
  if (values) *values = std::move(v);
  return t;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Norm-wise relative error: max |got - want| / max |want| (or the absolute error if want is 0).
inline double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double d = 0.0;
  for (size_t i = 0; i < want.size(); ++i) d = std::max(d, std::abs(got[i] - want[i]));
  const double scale = max_abs(want);
  return scale > 0.0 ? d / scale : d;
}

// Element-wise |got - want| <= atol + rtol |want|; on failure names the worst element.
inline ::testing::AssertionResult all_close(const std::vector<double>& got,
                                            const std::vector<double>& want, double rtol,
                                            double atol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  }
  size_t worst = 0, bad = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    const double allowed = atol + rtol * std::abs(want[i]);
    if (!(err <= allowed)) {  // also catches NaN
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err / allowed;
      if (bad == 1 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << want.size() << " elements outside rtol " << rtol << ", atol " << atol
         << "; worst at " << worst << ": got " << got[worst] << ", want " << want[worst]
         << " (norm-wise relative error " << rel_error(got, want) << ")";
}

// Central differences of the scalar f with respect to every element of x (restored after).
inline std::vector<double> numeric_grad(const std::function<double()>& f, std::vector<double>& x,
                                        double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = f();
    x[i] = saved - h;
    const double down = f();
    x[i] = saved;
    g[i] = (up - down) / (2.0 * h);
  }
  return g;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// fn() must throw E whose what() contains every one of `parts`.
template <typename E, typename Fn>
::testing::AssertionResult throws_with(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const E& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) {
      if (what.find(p) == std::string::npos) {
        return ::testing::AssertionFailure() << "message lacks \"" << p << "\": " << what;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw another type: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace memfit::kernels::test
