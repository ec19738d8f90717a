// AdamW: the fast update against the double reference over several steps and sizes, one step
// worked by hand with torch.optim.AdamW's formula, grad_scale, and typed errors. (An optimizer
// has no backward, so there is no finite-difference check here.)
#include "memfit/kernels/cpu/adamw.h"

#include <gtest/gtest.h>

#include "memfit/kernels/ref/adamw_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

class AdamWFast : public ::testing::TestWithParam<int64_t> {};

TEST_P(AdamWFast, MatchesReferenceOverSteps) {
  const int64_t n = GetParam();
  MemoryPool pool;
  const AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  // The reference gets the same float hyperparameters, widened: only arithmetic differs.
  const ref::AdamWRefHyper hr{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  const float grad_scale = 0.5f;
  std::vector<double> p;
  Tensor param = random_tensor(pool, {n}, 61, &p);
  Tensor m = make_tensor(pool, {n}), v = make_tensor(pool, {n}), grad = make_tensor(pool, {n});
  std::vector<double> m_ref(n, 0.0), v_ref(n, 0.0);
  for (int64_t t = 1; t <= 3; ++t) {
    std::vector<double> g = random_values(n, 62 + static_cast<uint32_t>(t), -2, 2);
    copy_in(grad, g);
    adamw_update(param, grad, m, v, h, t, grad_scale);
    ref::adamw_update_ref(p.data(), g.data(), m_ref.data(), v_ref.data(), n, hr, t, grad_scale);
  }
  EXPECT_TRUE(all_close(to_doubles(m), m_ref, 1e-6, 1e-7)) << "m";
  EXPECT_TRUE(all_close(to_doubles(v), v_ref, 1e-6, 1e-9)) << "v";
  // Each step moves p by about lr; float rounding of p ~ 1 is the main error.
  EXPECT_TRUE(all_close(to_doubles(param), p, 1e-6, 1e-6)) << "param";
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdamWFast, ::testing::Values(1, 15, 16, 33, 100003));

TEST(AdamW, OneStepByHand) {
  MemoryPool pool;
  Tensor p = make_tensor(pool, {1}), g = make_tensor(pool, {1}), m = make_tensor(pool, {1}),
         v = make_tensor(pool, {1});
  copy_in(p, std::vector<double>{1.0});
  copy_in(g, std::vector<double>{0.5});
  // Hyperparameters exact in float (the struct holds floats: 0.9f is not 0.9, so 1 - b1 would
  // be 0.100000024). lr 0.125, wd 0.25: p = 0.96875 after decay; m = 0.125 * 0.5 = 0.0625;
  // v = 2^-10 * 0.25 = 2^-12; bias corrections 0.125 and 2^-10 give m_hat 0.5 and
  // sqrt(v_hat) 0.5; p = 0.96875 - 0.125 * 0.5 / (0.5 + 1e-8).
  adamw_update(p, g, m, v, AdamWHyper{0.125f, 0.875f, 1.0f - 0x1p-10f, 1e-8f, 0.25f}, 1);
  EXPECT_NEAR(p.data<float>()[0], 0.96875 - 0.125 * 0.5 / (0.5 + 1e-8), 6e-8);
  EXPECT_EQ(m.data<float>()[0], 0.0625f);
  EXPECT_EQ(v.data<float>()[0], 0x1p-12f);
}

TEST(AdamW, GradScaleMultipliesTheGradientFirst) {
  MemoryPool pool;
  std::vector<double> p0, g0;
  Tensor pa = random_tensor(pool, {40}, 1, &p0), pb = random_tensor(pool, {40}, 1);
  Tensor ga = random_tensor(pool, {40}, 2, &g0), gb = make_tensor(pool, {40});
  for (double& x : g0) x *= 4.0;
  copy_in(gb, g0);
  Tensor ma = make_tensor(pool, {40}), va = make_tensor(pool, {40}), mb = make_tensor(pool, {40}),
         vb = make_tensor(pool, {40});
  const AdamWHyper h{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  adamw_update(pa, ga, ma, va, h, 1);
  adamw_update(pb, gb, mb, vb, h, 1, 0.25f);  // 4 g scaled by 1/4: exactly g
  EXPECT_EQ(to_doubles(pa), to_doubles(pb));
  EXPECT_EQ(to_doubles(va), to_doubles(vb));
}

TEST(AdamW, ShapeDTypeAndStepErrors) {
  MemoryPool pool;
  Tensor p = make_tensor(pool, {16}), g = make_tensor(pool, {16}), m = make_tensor(pool, {16}),
         v = make_tensor(pool, {15});
  EXPECT_TRUE(throws_with<ShapeError>([&] { adamw_update(p, g, m, v, AdamWHyper{}, 1); },
                                      {"[adamw_update]", "(16,)", "(15,)"}));
  Tensor v_ok = make_tensor(pool, {16});
  EXPECT_TRUE(throws_with<Error>([&] { adamw_update(p, g, m, v_ok, AdamWHyper{}, 0); },
                                 {"[adamw_update]", "t = 0"}));
  Tensor g_bf16 = make_tensor(pool, {16}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { adamw_update(p, g_bf16, m, v_ok, AdamWHyper{}, 1); },
                                      {"[adamw_update]", "grad", "bf16"}));
}

}  // namespace
}  // namespace memfit::kernels
