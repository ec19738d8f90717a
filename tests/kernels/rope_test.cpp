// RoPE: the double reference against finite differences; the fast rotation against the
// reference on the same table, over head sizes whose half is and is not a multiple of the
// vector width, multi-head and grouped-query layouts, with v untouched; the inverse frequencies
// (default and Llama 3 scaled) and the cos/sin table against double; and typed errors.
#include "memfit/kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "memfit/kernels/ref/rope_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

struct RopeCase {
  int64_t B, T;
  int q, kv;
  int64_t hs;
};

std::string case_name(const RopeCase& c) {
  return fmt::format("B{}T{}q{}kv{}hs{}", c.B, c.T, c.q, c.kv, c.hs);
}

// A (T_max, hs) table from the default frequencies (theta 10000), and its values as doubles.
Tensor make_table(MemoryPool& pool, int64_t T_max, int64_t hs, std::vector<double>* values) {
  Tensor table = make_tensor(pool, {T_max, hs});
  rope_table(table, rope_inv_freq(static_cast<int>(hs), 10000.0));
  if (values) *values = to_doubles(table);
  return table;
}

// loss = sum(rope(x) * wout): its gradient is the transposed rotation of wout (v: wout itself).
TEST(RopeRef, BackwardMatchesFiniteDifferences) {
  for (RopeCase c : {RopeCase{1, 3, 1, 1, 2}, RopeCase{2, 4, 2, 1, 6}, RopeCase{1, 5, 4, 2, 8}}) {
    const int64_t n = c.B * c.T * (c.q + 2 * c.kv) * c.hs;
    std::vector<double> inv(c.hs / 2), table(c.T * c.hs);
    ref::rope_inv_freq_ref(inv.data(), c.hs, 100.0);
    ref::rope_table_ref(table.data(), inv.data(), c.T, c.hs);
    std::vector<double> x = random_values(n, 1), wout = random_values(n, 2);
    auto loss = [&] {
      std::vector<double> y = x;
      ref::rope_forward_ref(y.data(), table.data(), c.B, c.T, c.q, c.kv, c.hs);
      return dot(y, wout);
    };
    std::vector<double> dx = wout;
    ref::rope_backward_ref(dx.data(), table.data(), c.B, c.T, c.q, c.kv, c.hs);
    EXPECT_TRUE(all_close(dx, numeric_grad(loss, x), 1e-7, 1e-9)) << case_name(c);
  }
}

class RopeFast : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeFast, MatchesReferenceAndLeavesVUntouched) {
  const RopeCase c = GetParam();
  MemoryPool pool;
  const AttentionHeads heads(c.q, c.kv);
  const int64_t W = heads.qkv_width(c.hs), qk = (c.q + c.kv) * c.hs;
  std::vector<double> table, x, dy;
  Tensor tab = make_table(pool, c.T + 3, c.hs, &table);  // more rows than positions
  Tensor qkv = random_tensor(pool, {c.B, c.T, W}, 21, &x);
  rope_forward(qkv, tab, heads);
  std::vector<double> want = x;
  ref::rope_forward_ref(want.data(), table.data(), c.B, c.T, c.q, c.kv, c.hs);
  // A product and a fused multiply-add in f32: within 2.5 ulp of 1 (|x| < 1, |cos|, |sin| <= 1).
  const std::vector<double> got = to_doubles(qkv);
  EXPECT_TRUE(all_close(got, want, 0, 3e-7)) << case_name(c) << " forward";
  for (int64_t r = 0; r < c.B * c.T; ++r)
    for (int64_t i = qk; i < W; ++i) ASSERT_EQ(got[r * W + i], x[r * W + i]) << "v changed";

  Tensor dqkv = random_tensor(pool, {c.B, c.T, W}, 22, &dy);
  rope_backward(dqkv, tab, heads);
  std::vector<double> dwant = dy;
  ref::rope_backward_ref(dwant.data(), table.data(), c.B, c.T, c.q, c.kv, c.hs);
  const std::vector<double> dgot = to_doubles(dqkv);
  EXPECT_TRUE(all_close(dgot, dwant, 0, 3e-7)) << case_name(c) << " backward";
  for (int64_t r = 0; r < c.B * c.T; ++r)
    for (int64_t i = qk; i < W; ++i) ASSERT_EQ(dgot[r * W + i], dy[r * W + i]) << "dv changed";

  // Backward undoes forward (the rotation is orthogonal), up to rounding.
  rope_backward(qkv, tab, heads);
  EXPECT_TRUE(all_close(to_doubles(qkv), x, 0, 6e-7)) << case_name(c) << " round trip";
}

// hs/2 = 1, 3, 17 (below, between and above a vector of 8 and 16 lanes), 32 (TinyLlama's 64),
// 64 (Llama's 128); multi-head, grouped-query (4 : 2, 8 : 1) and a long row for the threads.
INSTANTIATE_TEST_SUITE_P(Shapes, RopeFast,
                         ::testing::Values(RopeCase{1, 1, 1, 1, 2}, RopeCase{2, 3, 2, 2, 6},
                                           RopeCase{1, 7, 4, 2, 34}, RopeCase{2, 5, 3, 3, 64},
                                           RopeCase{1, 9, 8, 1, 128}, RopeCase{2, 64, 4, 4, 64},
                                           RopeCase{1, 130, 6, 2, 128}),
                         [](const auto& info) { return case_name(info.param); });

// Default frequencies: the f32 exponent (2i/hs rounded) and the f32 power and reciprocal keep
// each within 2e-6 relative of theta^(-2i/hs) (about ln(theta) times the exponent's rounding).
TEST(RopeInvFreq, DefaultMatchesDouble) {
  for (int hs : {2, 64, 80, 128}) {
    for (double theta : {10000.0, 500000.0}) {
      const std::vector<float> got = rope_inv_freq(hs, theta);
      ASSERT_EQ(got.size(), static_cast<size_t>(hs / 2));
      std::vector<double> want(hs / 2);
      ref::rope_inv_freq_ref(want.data(), hs, theta);
      EXPECT_EQ(got[0], 1.0f);
      EXPECT_TRUE(all_close(std::vector<double>(got.begin(), got.end()), want, 2e-6, 0))
          << "hs " << hs << " theta " << theta;
    }
  }
}

// Llama 3.1's config (theta 500000, factor 8, low 1, high 4, original 8192): the
// high-frequency band is the default, the low one the default / 8 exactly, and the band between
// interpolates; all within 4e-6 of the double formula.
TEST(RopeInvFreq, Llama3ScalingMatchesDouble) {
  const RopeScaling sc{8.0f, 1.0f, 4.0f, 8192};
  for (int hs : {64, 128}) {
    const std::vector<float> got = rope_inv_freq(hs, 500000.0, sc), base = rope_inv_freq(hs, 5e5);
    std::vector<double> want(hs / 2);
    ref::rope_inv_freq_ref(want.data(), hs, 500000.0, 8.0, 1.0, 4.0, 8192.0);
    EXPECT_TRUE(all_close(std::vector<double>(got.begin(), got.end()), want, 4e-6, 0))
        << "hs " << hs;
    int high = 0, low = 0, mid = 0;
    for (int i = 0; i < hs / 2; ++i) {
      const double wavelen = 2 * M_PI / base[i];
      if (wavelen < 2048 * (1 - 1e-6)) {
        EXPECT_EQ(got[i], base[i]) << i;
        ++high;
      } else if (wavelen > 8192 * (1 + 1e-6)) {
        EXPECT_EQ(got[i], base[i] / 8.0f) << i;
        ++low;
      } else {
        EXPECT_LT(got[i], base[i]) << i;
        EXPECT_GT(got[i], base[i] / 8.0f) << i;
        ++mid;
      }
    }
    EXPECT_GT(high, 0);
    EXPECT_GT(low, 0);
    EXPECT_GT(mid, 0);
  }
  // Disabled scaling is the default.
  EXPECT_EQ(rope_inv_freq(128, 5e5, RopeScaling{}), rope_inv_freq(128, 5e5));
}

// Llama 3.1's inverse frequencies (hs 128, theta 500000, llama3 scaling 8, 1, 4, 8192) as
// transformers' _compute_default_rope_parameters and _compute_llama3_parameters give them,
// run in PyTorch 1.13 on CPU: ours must equal them to the bit.
TEST(RopeInvFreq, Llama31EqualsTransformersBitForBit) {
  const std::vector<float> torch = {
    0x1p+0f, 0x1.a11582p-1f, 0x1.53c38cp-1f, 0x1.14c708p-1f, 0x1.c2ef78p-2f, 0x1.6f56fap-2f,
    0x1.2b3dc6p-2f, 0x1.e788c2p-3f, 0x1.8d276p-3f, 0x1.43874p-3f, 0x1.078d4p-3f, 0x1.ad6338p-4f,
    0x1.5dc95ap-4f, 0x1.1cf13p-4f, 0x1.d03ccep-5f, 0x1.7a2d08p-5f, 0x1.34119p-5f, 0x1.f5ea7ep-6f,
    0x1.98de92p-6f, 0x1.4d1272p-6f, 0x1.0f5386p-6f, 0x1.ba0dd8p-7f, 0x1.681adap-7f, 0x1.2558fep-7f,
    0x1.ddee9ep-8f, 0x1.8554ecp-8f, 0x1.3d2804p-8f, 0x1.025c6ap-8f, 0x1.a4ee4p-9f, 0x1.1bfa0cp-9f,
    0x1.67a23ap-10f, 0x1.c12f3cp-11f, 0x1.132ba4p-11f, 0x1.47e21p-12f, 0x1.765ba4p-13f,
    0x1.90d10cp-14f, 0x1.46831ap-14f, 0x1.09fb7ep-14f, 0x1.b15902p-15f, 0x1.610332p-15f,
    0x1.1f91fp-15f, 0x1.d484dep-16f, 0x1.7da9e8p-16f, 0x1.36e8eap-16f, 0x1.fa8b86p-17f,
    0x1.9ca3eap-17f, 0x1.5024d6p-17f, 0x1.11d41ep-17f, 0x1.be2188p-18f, 0x1.6b6d0ep-18f,
    0x1.280d96p-18f, 0x1.e257p-19f, 0x1.88ec2p-19f, 0x1.4014d2p-19f, 0x1.04be68p-19f,
    0x1.a8d01p-20f, 0x1.5a0f4ep-20f, 0x1.19e8p-20f, 0x1.cb4a9ap-21f, 0x1.76258ep-21f,
    0x1.30c94ep-21f, 0x1.f09184p-22f, 0x1.94836p-22f, 0x1.4985fep-22f};
  EXPECT_EQ(rope_inv_freq(128, 500000.0, RopeScaling{8.0f, 1.0f, 4.0f, 8192}), torch);
}

// Each entry within half an ulp of cos / sin of the f32 angle float(t) * inv_freq[i]; against
// the exact angle, that angle's own rounding (2^-24 of it) more.
TEST(RopeTable, MatchesDoubleOfTheF32Angle) {
  MemoryPool pool;
  for (int hs : {2, 34, 128}) {
    const int64_t T = 300;
    const std::vector<float> inv = rope_inv_freq(hs, 10000.0);
    Tensor table = make_tensor(pool, {T, hs});
    rope_table(table, inv);
    const std::vector<double> got = to_doubles(table);
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < hs / 2; ++i) {
        const float a32 = static_cast<float>(t) * inv[i];
        ASSERT_EQ(got[t * hs + i], static_cast<float>(std::cos(static_cast<double>(a32))));
        ASSERT_EQ(got[t * hs + hs / 2 + i], static_cast<float>(std::sin(static_cast<double>(a32))));
        const double exact = static_cast<double>(t) * inv[i];
        const double tol = 0x1p-24 * (exact + 1.0);
        ASSERT_NEAR(got[t * hs + i], std::cos(exact), tol) << t << " " << i;
        ASSERT_NEAR(got[t * hs + hs / 2 + i], std::sin(exact), tol) << t << " " << i;
      }
    EXPECT_EQ(got[0], 1.0);             // position 0: cos 1
    EXPECT_EQ(got[hs / 2], 0.0);        // and sin 0
  }
}

TEST(Rope, ErrorsNameTheOpAndShapes) {
  MemoryPool pool;
  const AttentionHeads heads(4, 2);
  Tensor table = make_table(pool, 8, 16, nullptr);
  Tensor qkv = make_tensor(pool, {2, 8, heads.qkv_width(16)});
  Tensor narrow = make_tensor(pool, {2, 8, 100});
  EXPECT_TRUE(throws_with<ShapeError>([&] { rope_forward(narrow, table, heads); },
                                      {"[rope_forward]", "(2, 8, 100)", "(B, T, 128)"}));
  Tensor long_qkv = make_tensor(pool, {1, 9, heads.qkv_width(16)});
  EXPECT_TRUE(throws_with<ShapeError>([&] { rope_backward(long_qkv, table, heads); },
                                      {"[rope_backward]", "9 positions", "(8, 16)"}));
  Tensor odd_table = make_tensor(pool, {8, 15});
  EXPECT_TRUE(throws_with<ShapeError>([&] { rope_forward(qkv, odd_table, heads); },
                                      {"[rope_forward]", "(8, 15)", "even"}));
  EXPECT_TRUE(throws_with<Error>([&] { rope_forward(qkv, table, AttentionHeads(4, 3)); },
                                 {"[rope_forward]", "4 query heads", "3 key/value"}));
  Tensor qkv_i = make_tensor(pool, {2, 8, heads.qkv_width(16)}, DType::i32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { rope_forward(qkv_i, table, heads); },
                                      {"[rope_forward]", "qkv", "i32"}));
  Tensor table16 = make_tensor(pool, {8, 16}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { rope_forward(qkv, table16, heads); },
                                      {"[rope_forward]", "table", "f32", "bf16"}));
  EXPECT_TRUE(throws_with<Error>([&] { rope_inv_freq(15, 1e4); }, {"[rope_inv_freq]", "15"}));
  const std::vector<float> inv = rope_inv_freq(16, 1e4);
  Tensor wide = make_tensor(pool, {8, 18});
  EXPECT_TRUE(throws_with<ShapeError>([&] { rope_table(wide, inv); },
                                      {"[rope_table]", "(8, 18)", "(T, 16)"}));
}

}  // namespace
}  // namespace memfit::kernels
