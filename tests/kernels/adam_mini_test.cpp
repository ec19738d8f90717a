// Adam-mini kernel against a double-precision Adam-mini over equal blocks, including blocks of
// one element (AdamW) and one block for the whole tensor; its two halves (the blocks' sums, then
// the step from them: a tensor-parallel rank's, Note [Tensor parallel]) against the whole step.
#include "memfit/kernels/cpu/adam_mini.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

// The sums, then the step from them: with the rank's own sums and whole_len = block_len, the
// kernel's step bit for bit; two halves of every block, their sums added, the whole blocks' step
// within a float's rounding of the mean.
TEST(AdamMiniKernel, StepFromSumsIsTheWholeStep) {
  const AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const int64_t blocks = 37, len = 96, n = blocks * len;
  MemoryPool pool;
  auto make = [&](int64_t count, const char* name) {
    Tensor t = Tensor::empty(pool, {count}, DType::f32, Category::optimizer, name);
    std::fill(t.data<float>(), t.data<float>() + count, 0.0f);
    return t;
  };
  Tensor p = make(n, "p"), g = make(n, "g"), m = make(n, "m"), v = make(blocks, "v");
  Tensor p2 = make(n, "p2"), m2 = make(n, "m2"), v2 = make(blocks, "v2");
  // The same blocks as two halves of 48 columns, each half its own tensor (a rank's slice).
  Tensor ph[2] = {make(n / 2, "p0"), make(n / 2, "p1")};
  Tensor gh[2] = {make(n / 2, "g0"), make(n / 2, "g1")};
  Tensor mh[2] = {make(n / 2, "m0"), make(n / 2, "m1")};
  Tensor vh[2] = {make(blocks, "v0"), make(blocks, "v1")};
  // Rank r's half of block b of a whole slab `whole` (len values a block) into its own.
  auto halve = [&](const Tensor& whole, Tensor& mine, int r) {
    for (int64_t b = 0; b < blocks; ++b)
      std::copy(whole.data<float>() + b * len + r * len / 2,
                whole.data<float>() + b * len + (r + 1) * len / 2,
                mine.data<float>() + b * len / 2);
  };
  fill(p, 5, 1.0f);
  std::copy(p.data<float>(), p.data<float>() + n, p2.data<float>());
  for (int r = 0; r < 2; ++r) halve(p, ph[r], r);
  for (int t = 1; t <= 3; ++t) {
    fill(g, 70 + t, 0.3f);
    adam_mini_update(p, g, m, v, len, h, t, 0.5f);
    std::vector<double> sums(blocks);
    adam_mini_block_sums(g, len, 0.5f, sums);
    adam_mini_update_from_sums(p2, g, m2, v2, len, sums, len, h, t, 0.5f);
    std::vector<double> half[2] = {std::vector<double>(blocks), std::vector<double>(blocks)};
    for (int r = 0; r < 2; ++r) {
      halve(g, gh[r], r);
      adam_mini_block_sums(gh[r], len / 2, 0.5f, half[r]);
    }
    for (int64_t b = 0; b < blocks; ++b) half[0][b] += half[1][b];  // the group's sum
    for (int r = 0; r < 2; ++r)
      adam_mini_update_from_sums(ph[r], gh[r], mh[r], vh[r], len / 2, half[0], len, h, t, 0.5f);
  }
  EXPECT_EQ(0, std::memcmp(p.data<float>(), p2.data<float>(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v.data<float>(), v2.data<float>(), blocks * sizeof(float)));
  double worst = 0;
  for (int64_t b = 0; b < blocks; ++b)
    for (int r = 0; r < 2; ++r)
      for (int64_t i = 0; i < len / 2; ++i)
        worst = std::max(worst, std::abs(double(ph[r].data<float>()[b * len / 2 + i]) -
                                         double(p.data<float>()[b * len + r * len / 2 + i])));
  EXPECT_LE(worst, 1e-6);
  for (int64_t b = 0; b < blocks; ++b)
    EXPECT_NEAR(vh[0].data<float>()[b], v.data<float>()[b], 1e-6 * v.data<float>()[b]) << b;
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
