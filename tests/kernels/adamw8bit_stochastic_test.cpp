// 8-bit AdamW on pure bf16 weights (--master-weights none --optim adamw8bit): the 8-bit state is
// bit-identical to the f32-weight update's on the widened weights, each weight lands on one of
// the two bf16 neighbours of that update's f32 result, and the rounding is reproducible from the
// seed and the step and independent of how the tensor is split into pieces; both the quantised
// path and the f32-state path (tensors under 4096 values).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "memfit/kernels/cpu/adamw8bit.h"
#include "memfit/kernels/cpu/blockwise_quant.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

const AdamWHyper kHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};

struct State {
  Tensor mq, ma, vq, va;  // quantised moments
  Tensor m, v;            // f32 moments
  State(MemoryPool& pool, int64_t n) {
    mq = Tensor::empty(pool, {n}, DType::i8, Category::optimizer, "mq");
    vq = Tensor::empty(pool, {n}, DType::i8, Category::optimizer, "vq");
    ma = make_tensor(pool, {quant_blocks(n)});
    va = make_tensor(pool, {quant_blocks(n)});
    m = make_tensor(pool, {n});
    v = make_tensor(pool, {n});
    mq.zero(), vq.zero(), ma.zero(), va.zero(), m.zero(), v.zero();
  }
};

// One update of `param` (f32 or bf16) over [b, e) with index0 = b.
void update(bool quantised, Tensor& param, const Tensor& grad, State& s, int64_t t,
            uint64_t seed, int64_t b, int64_t e) {
  const int64_t n = e - b;
  Tensor p = param.view(b, {n}), g = grad.view(b, {n});
  if (quantised) {
    const int64_t qb = b / kQuantBlock, qn = quant_blocks(n);
    Tensor mq = s.mq.view(b, {n}), vq = s.vq.view(b, {n}), ma = s.ma.view(qb, {qn}),
           va = s.va.view(qb, {qn});
    if (p.dtype() == DType::bf16)
      adamw8bit_update_stochastic(p, g, mq, ma, vq, va, kHyper, t, 0.5f, seed,
                                  static_cast<uint64_t>(b));
    else
      adamw8bit_update(p, g, mq, ma, vq, va, kHyper, t, 0.5f);
  } else {
    Tensor m = s.m.view(b, {n}), v = s.v.view(b, {n});
    if (p.dtype() == DType::bf16)
      adamw8bit_update_f32_stochastic(p, g, m, v, kHyper, t, 0.5f, seed,
                                      static_cast<uint64_t>(b));
    else
      adamw8bit_update_f32(p, g, m, v, kHyper, t, 0.5f);
  }
}

class AdamW8bitStochastic : public ::testing::TestWithParam<bool> {};

TEST_P(AdamW8bitStochastic, LandsOnANeighbourOfTheF32UpdateWithTheSameState) {
  const bool quantised = GetParam();
  const int64_t n = quantised ? 5000 : 1500;  // partial blocks and vectors
  MemoryPool pool;
  std::vector<double> p;
  Tensor param = random_any(pool, {n}, DType::bf16, 2, &p);
  Tensor ref = make_tensor(pool, {n}), grad = random_tensor(pool, {n}, 3, nullptr, -2, 2);
  copy_in(ref, p);  // the same (bf16) weights in f32
  State s(pool, n), s32(pool, n);
  for (int64_t t = 1; t <= 2; ++t) {
    update(quantised, param, grad, s, t, 1234, 0, n);
    update(quantised, ref, grad, s32, t, 0, 0, n);
    for (const auto& [a, b] : {std::pair{&s.mq, &s32.mq}, {&s.ma, &s32.ma}, {&s.vq, &s32.vq},
                               {&s.va, &s32.va}, {&s.m, &s32.m}, {&s.v, &s32.v}})
      ASSERT_TRUE(same_bits(*a, *b)) << "step " << t;
    const auto* got = static_cast<const uint16_t*>(param.raw_data());
    const float* want = ref.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = std::bit_cast<uint32_t>(want[i]);
      const uint16_t down = static_cast<uint16_t>(u >> 16);
      ASSERT_TRUE(got[i] == down || ((u & 0xffffu) != 0 && got[i] == down + 1))
          << "step " << t << " element " << i;
    }
    copy_in(ref, to_doubles_any(param));  // both continue from the rounded weights
  }
}

TEST_P(AdamW8bitStochastic, ReproducibleBySeedStepAndSplit) {
  const bool quantised = GetParam();
  const int64_t n = quantised ? 3 * kQuantBlock * 7 + 5 : 2100, cut = quantised ? 2 * kQuantBlock * 4 : 700;
  MemoryPool pool;
  auto run = [&](uint64_t seed, int64_t t, bool split) {
    Tensor param = random_any(pool, {n}, DType::bf16, 2);
    Tensor grad = random_tensor(pool, {n}, 3);
    State s(pool, n);
    for (int64_t k = 1; k <= t; ++k) {
      if (split) {
        update(quantised, param, grad, s, k, seed, 0, cut);
        update(quantised, param, grad, s, k, seed, cut, n);
      } else {
        update(quantised, param, grad, s, k, seed, 0, n);
      }
    }
    return param;
  };
  EXPECT_TRUE(same_bits(run(5, 1, false), run(5, 1, false)));
  EXPECT_TRUE(same_bits(run(5, 2, false), run(5, 2, true)));
  EXPECT_FALSE(same_bits(run(5, 1, false), run(6, 1, false)));
}

INSTANTIATE_TEST_SUITE_P(Paths, AdamW8bitStochastic, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Quantised" : "F32State"; });

TEST(AdamW8bitStochasticErrors, WeightsMustBeBf16) {
  MemoryPool pool;
  const int64_t n = 64;
  Tensor p = make_tensor(pool, {n}), g = make_tensor(pool, {n});
  State s(pool, n);
  EXPECT_THROW(adamw8bit_update_f32_stochastic(p, g, s.m, s.v, kHyper, 1, 1.0f, 1, 0), Error);
  Tensor pb = make_tensor(pool, {n}, DType::bf16);
  EXPECT_THROW(adamw8bit_update_f32(pb, g, s.m, s.v, kHyper, 1, 1.0f), Error);
}

}  // namespace
}  // namespace memfit::kernels
