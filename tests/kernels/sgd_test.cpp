// Plain SGD kernel: p - lr (scale g + wd p), element for element.
#include "memfit/kernels/cpu/sgd.h"

#include <gtest/gtest.h>

#include "optimizer_reference.h"

namespace memfit::kernels {
namespace {

TEST(SgdKernel, MatchesFormula) {
  const int64_t n = 70000 + 3;  // over the threading threshold
  MemoryPool pool;
  Tensor p = Tensor::empty(pool, {n}, DType::f32, Category::params, "p");
  Tensor g = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
  auto pv = memfit::testing::normal_vector(n, 1), gv = memfit::testing::normal_vector(n, 2);
  std::copy(pv.begin(), pv.end(), p.data<float>());
  std::copy(gv.begin(), gv.end(), g.data<float>());
  sgd_update(p, g, 0.1f, 0.01f, 0.5f);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = pv[i] - 0.1 * (0.5 * gv[i] + 0.01 * pv[i]);
  memfit::testing::expect_all_close(p.data<float>(), ref.data(), n, 1e-6, 1e-6, "p");
}

}  // namespace
}  // namespace memfit::kernels
