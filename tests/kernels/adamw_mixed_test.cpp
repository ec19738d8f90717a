// AdamW in mixed precision: with master weights the f32 state is bit-identical to the FP32
// update and the working copy is exactly the new master rounded to nearest even; on pure bf16
// weights (stochastic rounding) each weight lands on one of the two bf16 neighbours of the f32
// result, m and v are bit-identical to the FP32 update's, the result is reproducible from the
// seed and independent of how a slab is split, and updates below half an ulp survive on
// average where rounding to nearest would drop them; and the dtype errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "memfit/kernels/cpu/adamw.h"
#include "memfit/kernels/cpu/convert.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

const AdamWHyper kHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};

class AdamWMixed : public ::testing::TestWithParam<int64_t> {};

TEST_P(AdamWMixed, MasterWeightsWriteTheRoundedWorkingCopy) {
  const int64_t n = GetParam();
  MemoryPool pool;
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<double> p;
    Tensor master = random_tensor(pool, {n}, 1, &p), ref = make_tensor(pool, {n});
    copy_in(ref, p);
    Tensor working = make_tensor(pool, {n}, t), grad = make_tensor(pool, {n});
    Tensor m = make_tensor(pool, {n}), v = make_tensor(pool, {n}), m32 = make_tensor(pool, {n}),
           v32 = make_tensor(pool, {n});
    for (int64_t step = 1; step <= 3; ++step) {
      copy_in(grad, random_values(n, 10 + static_cast<uint32_t>(step), -2, 2));
      adamw_update_master(master, working, grad, m, v, kHyper, step, 0.5f);
      adamw_update(ref, grad, m32, v32, kHyper, step, 0.5f);
    }
    EXPECT_TRUE(same_bits(master, ref));
    EXPECT_TRUE(same_bits(m, m32));
    EXPECT_TRUE(same_bits(v, v32));
    Tensor rounded_master = make_tensor(pool, {n}, t);
    convert(rounded_master, master);
    EXPECT_TRUE(same_bits(working, rounded_master));
  }
}

TEST_P(AdamWMixed, StochasticBf16LandsOnANeighbourOfTheF32Update) {
  const int64_t n = GetParam();
  MemoryPool pool;
  std::vector<double> p;
  Tensor param = random_any(pool, {n}, DType::bf16, 2, &p);
  Tensor ref = make_tensor(pool, {n}), grad = random_tensor(pool, {n}, 3, nullptr, -2, 2);
  copy_in(ref, p);  // the same weights in f32
  Tensor m = random_tensor(pool, {n}, 4, nullptr, -0.1, 0.1), v = make_tensor(pool, {n});
  std::vector<double> vv = random_values(n, 5, 0.0, 0.01);
  copy_in(v, vv);
  Tensor m32 = make_tensor(pool, {n}), v32 = make_tensor(pool, {n});
  copy_in(m32, to_doubles(m));
  copy_in(v32, vv);
  adamw_update_stochastic(param, grad, m, v, kHyper, 7, 0.5f, 1234);
  adamw_update(ref, grad, m32, v32, kHyper, 7, 0.5f);
  EXPECT_TRUE(same_bits(m, m32));
  EXPECT_TRUE(same_bits(v, v32));
  const auto* got = static_cast<const uint16_t*>(param.raw_data());
  const float* want = ref.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t down = static_cast<uint16_t>(std::bit_cast<uint32_t>(want[i]) >> 16);
    const bool exact = (std::bit_cast<uint32_t>(want[i]) & 0xffffu) == 0;
    ASSERT_TRUE(got[i] == down || (!exact && got[i] == down + 1)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdamWMixed, ::testing::Values(1, 17, 40001));

TEST(AdamWStochastic, ReproducibleBySeedAndSplit) {
  MemoryPool pool;
  const int64_t n = 4099;
  // split: update elements [0, 1000) and [1000, n) in two calls, each given its offset.
  auto run = [&](uint64_t seed, int64_t t, bool split, int64_t cut = 1000) {
    Tensor param = random_any(pool, {n}, DType::bf16, 2);
    Tensor grad = random_tensor(pool, {n}, 3), m = make_tensor(pool, {n}),
           v = make_tensor(pool, {n});
    if (!split) {
      adamw_update_stochastic(param, grad, m, v, kHyper, t, 1.0f, seed);
      return param;
    }
    for (auto [b, e] : {std::pair{int64_t{0}, cut}, std::pair{cut, n}}) {
      Tensor pv = param.view(b, {e - b}), mv = m.view(b, {e - b}), vv = v.view(b, {e - b});
      adamw_update_stochastic(pv, grad.view(b, {e - b}), mv, vv, kHyper, t, 1.0f, seed,
                              static_cast<uint64_t>(b));
    }
    return param;
  };
  EXPECT_TRUE(same_bits(run(5, 1, false), run(5, 1, false)));
  EXPECT_TRUE(same_bits(run(5, 1, false), run(5, 1, true)));
  EXPECT_FALSE(same_bits(run(5, 1, false), run(6, 1, false)));
  EXPECT_FALSE(same_bits(run(5, 1, false), run(5, 2, false)));  // a new stream every step
}

// lr * step of a tenth of an ulp on weights of 1: rounding to nearest keeps every weight at 1
// forever; stochastic rounding moves a tenth of them one ulp, so the mean follows the update.
TEST(AdamWStochastic, KeepsUpdatesBelowHalfAnUlpInExpectation) {
  MemoryPool pool;
  const int64_t n = 1 << 16;
  const float ulp = 0x1p-7f;  // bf16 spacing just above 1 is 2^-7; below 1 it is 2^-8
  // Adam's first step moves by lr * sign(g) (m_hat / sqrt(v_hat) = 1): choose lr = ulp / 10.
  const AdamWHyper h{ulp / 10, 0.9f, 0.999f, 1e-12f, 0.0f};
  Tensor param = make_tensor(pool, {n}, DType::bf16), grad = make_tensor(pool, {n});
  Tensor m = make_tensor(pool, {n}), v = make_tensor(pool, {n});
  std::vector<double> ones(n, 1.0), neg(n, -1.0);
  copy_in_any(param, ones);
  copy_in(grad, neg);  // the step is +lr
  adamw_update_stochastic(param, grad, m, v, h, 1, 1.0f, 42);
  double mean = 0.0;
  for (double x : to_doubles_any(param)) mean += (x - 1.0) / n;
  // Each weight moves by ulp with probability 1/10: the mean is ulp/10 within 5 sigma.
  const double sigma = ulp * std::sqrt(0.1 * 0.9 / n);
  EXPECT_NEAR(mean, ulp / 10, 5 * sigma);
  // The same update with master weights and a rounded working copy leaves the copy at 1.
  Tensor master = make_tensor(pool, {n}), working = make_tensor(pool, {n}, DType::bf16);
  copy_in(master, ones);
  Tensor m2 = make_tensor(pool, {n}), v2 = make_tensor(pool, {n});
  adamw_update_master(master, working, grad, m2, v2, h, 1, 1.0f);
  EXPECT_EQ(to_doubles_any(working), ones);
  EXPECT_NEAR(master.data<float>()[0], 1.0 + ulp / 10, 1e-7);
}

TEST(AdamWMixedErrors, DTypesAndCounts) {
  MemoryPool pool;
  Tensor p = make_tensor(pool, {16}), g = make_tensor(pool, {16}), m = make_tensor(pool, {16}),
         v = make_tensor(pool, {16});
  Tensor w32 = make_tensor(pool, {16}), w_bf = make_tensor(pool, {15}, DType::bf16);
  EXPECT_TRUE(
      throws_with<DTypeError>([&] { adamw_update_master(p, w32, g, m, v, AdamWHyper{}, 1); },
                              {"[adamw_update_master]", "working", "bf16 or f16", "f32"}));
  EXPECT_TRUE(
      throws_with<ShapeError>([&] { adamw_update_master(p, w_bf, g, m, v, AdamWHyper{}, 1); },
                              {"[adamw_update_master]", "working", "(15,)", "(16,)"}));
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { adamw_update_stochastic(p, g, m, v, AdamWHyper{}, 1, 1.0f, 0); },
      {"[adamw_update_stochastic]", "param", "bf16", "f32"}));
  Tensor pb = make_tensor(pool, {16}, DType::bf16), gb = make_tensor(pool, {16}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { adamw_update_stochastic(pb, gb, m, v, AdamWHyper{}, 1, 1.0f, 0); },
      {"[adamw_update_stochastic]", "grad", "f32", "bf16"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { adamw_update(pb, g, m, v, AdamWHyper{}, 1); },
                                      {"[adamw_update]", "param", "f32", "bf16"}));
}

}  // namespace
}  // namespace memfit::kernels
