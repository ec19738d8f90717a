// Adam-mini kernel against a double-precision Adam-mini over equal blocks, including blocks of
// one element (AdamW) and one block for the whole tensor.
#include "memfit/kernels/cpu/adam_mini.h"

#include <gtest/gtest.h>

#include "optimizer_reference.h"

namespace memfit::kernels {
namespace {

using memfit::testing::AdamRef;

void fill(Tensor& t, uint32_t seed, float stddev) {
  auto v = memfit::testing::normal_vector(t.numel(), seed, stddev);
  std::copy(v.begin(), v.end(), t.data<float>());
}

TEST(AdamMiniKernel, StepsMatchDoubleReference) {
  const AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const AdamRef r{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  struct Case {
    int64_t blocks, block_len;
  };
  for (Case c : {Case{13, 7}, Case{1, 1000}, Case{300, 1}, Case{40, 2048}}) {
    const int64_t n = c.blocks * c.block_len;
    MemoryPool pool;
    Tensor p = Tensor::empty(pool, {n}, DType::f32, Category::params, "p");
    Tensor g = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
    Tensor m = Tensor::empty(pool, {n}, DType::f32, Category::optimizer, "m");
    Tensor v = Tensor::empty(pool, {c.blocks}, DType::f32, Category::optimizer, "v");
    fill(p, 5, 1.0f);
    std::vector<double> pr(p.data<float>(), p.data<float>() + n), mr(n, 0.0), gr(n),
        vr(c.blocks, 0.0);
    for (int t = 1; t <= 3; ++t) {
      fill(g, 50 + t, 0.3f);
      for (int64_t i = 0; i < n; ++i) gr[i] = 0.25 * g.data<float>()[i];
      for (int64_t b = 0; b < c.blocks; ++b) {
        const int64_t o = b * c.block_len;
        memfit::testing::adam_mini_block_ref(&pr[o], &gr[o], &mr[o], vr[b], c.block_len, r, t);
      }
      adam_mini_update(p, g, m, v, c.block_len, h, t, 0.25f);
    }
    SCOPED_TRACE("blocks " + std::to_string(c.blocks) + " of " + std::to_string(c.block_len));
    memfit::testing::expect_all_close(p.data<float>(), pr.data(), n, 2e-6, 1e-6, "p");
    memfit::testing::expect_all_close(m.data<float>(), mr.data(), n, 1e-8, 1e-5, "m");
    memfit::testing::expect_all_close(v.data<float>(), vr.data(), c.blocks, 1e-10, 1e-5, "v");
  }
}

TEST(AdamMiniKernel, BlocksMustDivideTheTensor) {
  MemoryPool pool;
  Tensor p = Tensor::empty(pool, {10}, DType::f32, Category::params, "p");
  Tensor g = Tensor::empty(pool, {10}, DType::f32, Category::grads, "g");
  Tensor m = Tensor::empty(pool, {10}, DType::f32, Category::optimizer, "m");
  Tensor v = Tensor::empty(pool, {3}, DType::f32, Category::optimizer, "v");
  EXPECT_THROW(adam_mini_update(p, g, m, v, 3, AdamWHyper{}, 1), ShapeError);
  Tensor v2 = Tensor::empty(pool, {2}, DType::f32, Category::optimizer, "v");
  EXPECT_THROW(adam_mini_update(p, g, m, v2, 2, AdamWHyper{}, 1), ShapeError);  // needs 5
  Tensor v5 = Tensor::empty(pool, {5}, DType::f32, Category::optimizer, "v");
  EXPECT_NO_THROW(adam_mini_update(p, g, m, v5, 2, AdamWHyper{}, 1));
}

}  // namespace
}  // namespace memfit::kernels
