// AdamW with bf16 moments (--optim-state-dtype bf16): the fast update against the double
// reference over several steps and sizes, and bit for bit against the f32-moment kernel run on
// the widened moments then rounded (the definition: the same f32 arithmetic, the moments rounded
// to nearest even on store), for f32, master and pure bf16 weights; mismatched moment types.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/adamw.h"
#include "memfit/kernels/ref/adamw_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

std::vector<double> bf16_doubles(const Tensor& t) {
  const auto* p = static_cast<const uint16_t*>(t.raw_data());
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = f32_from_bf16(p[i]);
  return out;
}

void bf16_copy_in(Tensor& t, const std::vector<double>& v) {
  auto* p = static_cast<uint16_t*>(t.raw_data());
  for (size_t i = 0; i < v.size(); ++i) p[i] = bf16_from_f32(static_cast<float>(v[i]));
}

class AdamWBf16State : public ::testing::TestWithParam<int64_t> {};

// Each step the reference starts from our stored moments (exact in double), so a moment that
// rounds to the other bf16 neighbour (its f32 and double values on either side of a midpoint)
// does not carry into later steps; such moments are rare and one bf16 ulp off (or, for a
// moment whose update cancels, off by the f32 rounding of the operands).
TEST_P(AdamWBf16State, MatchesReferenceOverSteps) {
  const int64_t n = GetParam();
  MemoryPool pool;
  const AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const ref::AdamWRefHyper hr{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  const float grad_scale = 0.5f;
  std::vector<double> p;
  Tensor param = random_tensor(pool, {n}, 71, &p);
  Tensor m = make_tensor(pool, {n}, DType::bf16), v = make_tensor(pool, {n}, DType::bf16);
  bf16_copy_in(m, std::vector<double>(static_cast<size_t>(n), 0.0));
  bf16_copy_in(v, std::vector<double>(static_cast<size_t>(n), 0.0));
  Tensor grad = make_tensor(pool, {n});
  int64_t off_by_one = 0;
  for (int64_t t = 1; t <= 4; ++t) {
    std::vector<double> g = random_values(static_cast<size_t>(n), 72 + uint32_t(t), -2, 2);
    copy_in(grad, g);
    std::vector<double> m_ref = bf16_doubles(m), v_ref = bf16_doubles(v);
    p = to_doubles(param);
    adamw_update(param, grad, m, v, h, t, grad_scale);
    ref::adamw_update_bf16_state_ref(p.data(), g.data(), m_ref.data(), v_ref.data(), n, hr, t,
                                     grad_scale);
    EXPECT_TRUE(all_close(to_doubles(param), p, 1e-6, 1e-6)) << "param, step " << t;
    const std::vector<double> mg = bf16_doubles(m), vg = bf16_doubles(v);
    for (int64_t i = 0; i < n; ++i) {
      for (auto [got, want] : {std::pair{mg[i], m_ref[i]}, std::pair{vg[i], v_ref[i]}}) {
        if (got == want) continue;
        ++off_by_one;
        // One bf16 ulp (at most 2^-7 of the value), or, where m = lerp(m, g, 1 - b1) cancels,
        // the f32 rounding of its operands (|m|, |g| (1 - b1) under 0.1 here: 2^-27 each).
        ASSERT_LE(std::fabs(got - want), std::max(std::fabs(want) * 0x1p-7, 2e-8))
            << i << " step " << t;
      }
    }
  }
  EXPECT_LE(off_by_one, 4 * 2 * n / 1000 + 1) << "moments off by a bf16 ulp";
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdamWBf16State, ::testing::Values(1, 15, 16, 33, 100003));

enum class Weights { f32, master, stochastic };

// The bf16-moment step is the f32-moment step on the widened moments, with the results rounded
// to nearest even: bit for bit, whatever the weights.
void expect_same_as_rounded_f32(Weights mode) {
  const int64_t n = 1037;
  MemoryPool pool;
  const AdamWHyper h{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  Tensor grad = random_tensor(pool, {n}, 81);
  Tensor m16 = make_tensor(pool, {n}, DType::bf16), v16 = make_tensor(pool, {n}, DType::bf16);
  bf16_copy_in(m16, random_values(static_cast<size_t>(n), 82, -0.1, 0.1));
  bf16_copy_in(v16, random_values(static_cast<size_t>(n), 83, 0.0, 0.01));
  Tensor m32 = make_tensor(pool, {n}), v32 = make_tensor(pool, {n});
  copy_in(m32, bf16_doubles(m16));
  copy_in(v32, bf16_doubles(v16));
  Tensor pa = random_tensor(pool, {n}, 84), pb = random_tensor(pool, {n}, 84);
  Tensor wa = make_tensor(pool, {n}, DType::bf16), wb = make_tensor(pool, {n}, DType::bf16);
  bf16_copy_in(wa, to_doubles(pa));
  bf16_copy_in(wb, to_doubles(pa));
  for (int64_t t = 3; t <= 3; ++t) {
    switch (mode) {
      case Weights::f32:
        adamw_update(pa, grad, m16, v16, h, t, 0.5f);
        adamw_update(pb, grad, m32, v32, h, t, 0.5f);
        break;
      case Weights::master:
        adamw_update_master(pa, wa, grad, m16, v16, h, t, 0.5f);
        adamw_update_master(pb, wb, grad, m32, v32, h, t, 0.5f);
        break;
      case Weights::stochastic:
        adamw_update_stochastic(wa, grad, m16, v16, h, t, 0.5f, 7, 100);
        adamw_update_stochastic(wb, grad, m32, v32, h, t, 0.5f, 7, 100);
        break;
    }
  }
  EXPECT_EQ(std::memcmp(pa.raw_data(), pb.raw_data(), n * 4), 0) << "weights";
  EXPECT_EQ(std::memcmp(wa.raw_data(), wb.raw_data(), n * 2), 0) << "working / bf16 weights";
  const auto* mp = static_cast<const uint16_t*>(m16.raw_data());
  const auto* vp = static_cast<const uint16_t*>(v16.raw_data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(mp[i], bf16_from_f32(m32.data<float>()[i])) << "m " << i;
    ASSERT_EQ(vp[i], bf16_from_f32(v32.data<float>()[i])) << "v " << i;
  }
}

TEST(AdamWBf16State, IsTheF32StepRoundedF32Weights) { expect_same_as_rounded_f32(Weights::f32); }
TEST(AdamWBf16State, IsTheF32StepRoundedMaster) { expect_same_as_rounded_f32(Weights::master); }
TEST(AdamWBf16State, IsTheF32StepRoundedPureBf16) {
  expect_same_as_rounded_f32(Weights::stochastic);
}

TEST(AdamWBf16State, BfRoundReferenceTiesToEven) {
  EXPECT_EQ(ref::bf16_round_ref(1.0 + 0x1p-8), 1.0);                    // tie: even (1.0)
  EXPECT_EQ(ref::bf16_round_ref(1.0 + 3 * 0x1p-8), 1.0 + 0x1p-6);       // tie: even (up)
  EXPECT_EQ(ref::bf16_round_ref(1.0 + 0x1p-8 + 0x1p-30), 1.0 + 0x1p-7);  // past the tie
  EXPECT_EQ(ref::bf16_round_ref(-3.0), -3.0);
  EXPECT_EQ(ref::bf16_round_ref(0x1p-140), 0.0);  // below half of bf16's smallest subnormal
  for (double x : {0.1, -1e-6, 3.3e-12, 1234.5}) {
    EXPECT_EQ(ref::bf16_round_ref(x), f32_from_bf16(bf16_from_f32(static_cast<float>(x)))) << x;
  }
}

TEST(AdamWBf16State, MixedMomentTypesAreRefused) {
  MemoryPool pool;
  Tensor p = make_tensor(pool, {16}), g = make_tensor(pool, {16});
  Tensor m = make_tensor(pool, {16}, DType::bf16), v = make_tensor(pool, {16});
  EXPECT_TRUE(throws_with<DTypeError>([&] { adamw_update(p, g, m, v, AdamWHyper{}, 1); },
                                      {"[adamw_update]", "both f32 or both bf16", "bf16", "f32"}));
  Tensor m16 = make_tensor(pool, {16}, DType::f16), v16 = make_tensor(pool, {16}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { adamw_update(p, g, m16, v16, AdamWHyper{}, 1); },
                                      {"[adamw_update]", "f16"}));
}

}  // namespace
}  // namespace memfit::kernels
