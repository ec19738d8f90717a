// SwiGLU: the double reference against finite differences, the fast kernel against the
// reference over F below, at and above a vector and rows that threads split, in place over
// gate_up, saturated gates, and typed errors.
#include "memfit/kernels/cpu/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>

#include "memfit/kernels/ref/swiglu_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;
using NF = std::pair<int64_t, int64_t>;  // (N, F) of the output

TEST(SwigluRef, BackwardMatchesFiniteDifferences) {
  const int64_t N = 3, F = 5;
  std::vector<double> gu = random_values(N * 2 * F, 1, -6, 6), wout = random_values(N * F, 2);
  gu[0] = 0.0;
  std::vector<double> out(N * F);
  auto loss = [&] {
    ref::swiglu_forward_ref(out.data(), gu.data(), N, F);
    return dot(out, wout);
  };
  std::vector<double> dgu(N * 2 * F);
  ref::swiglu_backward_ref(dgu.data(), wout.data(), gu.data(), N, F);
  EXPECT_TRUE(all_close(dgu, numeric_grad(loss, gu), 1e-6, 1e-9));
}

// The gate_up input is (N, 2F).
class SwigluFast : public ::testing::TestWithParam<NF> {};

TEST_P(SwigluFast, MatchesReference) {
  const auto [N, F] = GetParam();
  MemoryPool pool;
  std::vector<double> gu, dy;
  // Gates wide enough to reach both saturated ends of the sigmoid.
  Tensor gate_up = random_tensor(pool, {N, 2 * F}, 51, &gu, -12, 12);
  Tensor dout = random_tensor(pool, {N, F}, 52, &dy);
  Tensor out = make_tensor(pool, {N, F}), dgate_up = make_tensor(pool, {N, 2 * F});

  std::vector<double> want(N * F), dwant(N * 2 * F);
  ref::swiglu_forward_ref(want.data(), gu.data(), N, F);
  ref::swiglu_backward_ref(dwant.data(), dy.data(), gu.data(), N, F);
  swiglu_forward(out, gate_up);
  EXPECT_TRUE(all_close(to_doubles(out), want, 2e-6, 1e-6)) << N << "x" << F << " forward";
  swiglu_backward(dgate_up, dout, gate_up);
  EXPECT_TRUE(all_close(to_doubles(dgate_up), dwant, 4e-6, 2e-6)) << N << "x" << F << " backward";
  // In place over gate_up, bit for bit.
  swiglu_backward(gate_up, dout, gate_up);
  EXPECT_EQ(to_doubles(gate_up), to_doubles(dgate_up));
}

// F = 1, 15, 16, 17 (about a vector of 16 lanes), 33; F = 1000 on 64 rows and TinyLlama's
// 5632 on 3 rows, which the threads split mid-row.
INSTANTIATE_TEST_SUITE_P(Shapes, SwigluFast,
                         ::testing::Values(NF{1, 1}, NF{3, 15}, NF{2, 16}, NF{5, 17}, NF{7, 33},
                                           NF{64, 1000}, NF{3, 5632}),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "x" +
                                  std::to_string(info.param.second);
                         });

TEST(Swiglu, LeadingDimsAreFlattened) {
  MemoryPool pool;
  std::vector<double> gu;
  Tensor gate_up = random_tensor(pool, {2, 3, 40}, 1, &gu, -4, 4);
  Tensor out = make_tensor(pool, {2, 3, 20});
  swiglu_forward(out, gate_up);
  std::vector<double> want(120);
  ref::swiglu_forward_ref(want.data(), gu.data(), 6, 20);
  EXPECT_TRUE(all_close(to_doubles(out), want, 2e-6, 1e-6));
}

// Saturated gates: silu(g) is g far right and 0 far left, its derivative 1 and 0; nothing
// overflows to inf or NaN.
TEST(Swiglu, SaturatedGatesStayFinite) {
  MemoryPool pool;
  const std::vector<double> g = {-1000, -100, -88.5, -30, 30, 88.5, 100, 1000};
  const int64_t F = static_cast<int64_t>(g.size());
  std::vector<double> gu = g;
  gu.insert(gu.end(), F, 2.0);  // u = 2
  Tensor gate_up = make_tensor(pool, {1, 2 * F}), out = make_tensor(pool, {1, F});
  Tensor dout = make_tensor(pool, {1, F}), dgate_up = make_tensor(pool, {1, 2 * F});
  copy_in(gate_up, gu);
  copy_in(dout, std::vector<double>(F, 1.0));
  swiglu_forward(out, gate_up);
  swiglu_backward(dgate_up, dout, gate_up);
  const std::vector<double> y = to_doubles(out), dg = to_doubles(dgate_up);
  for (int64_t i = 0; i < F; ++i) {
    SCOPED_TRACE(g[i]);
    EXPECT_NEAR(y[i], g[i] > 0 ? 2 * g[i] : 0.0, 1e-5 * std::abs(g[i]));
    EXPECT_NEAR(dg[i], g[i] > 0 ? 2.0 : 0.0, 1e-6);                   // dg = 2 silu'(g)
    EXPECT_NEAR(dg[F + i], g[i] > 0 ? g[i] : 0.0, 1e-6 * std::abs(g[i]));  // du = silu(g)
  }
}

TEST(Swiglu, ShapeAndDTypeErrors) {
  MemoryPool pool;
  Tensor gu = make_tensor(pool, {4, 24}), out = make_tensor(pool, {4, 12});
  Tensor odd = make_tensor(pool, {4, 25}), out_bad = make_tensor(pool, {4, 13});
  EXPECT_TRUE(throws_with<ShapeError>([&] { swiglu_forward(out, odd); },
                                      {"[swiglu_forward]", "gate_up", "(4, 25)", "even"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { swiglu_forward(out_bad, gu); },
                                      {"[swiglu_forward]", "out", "(4, 12)", "(4, 13)"}));
  Tensor dgu_bad = make_tensor(pool, {4, 26});
  EXPECT_TRUE(throws_with<ShapeError>([&] { swiglu_backward(dgu_bad, out, gu); },
                                      {"[swiglu_backward]", "dgate_up", "(4, 24)", "(4, 26)"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { swiglu_backward(gu, out_bad, gu); },
                                      {"[swiglu_backward]", "dout", "(4, 12)", "(4, 13)"}));
  Tensor gu_i = make_tensor(pool, {4, 24}, DType::i32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { swiglu_forward(out, gu_i); },
                                      {"[swiglu_forward]", "gate_up", "i32"}));
}

}  // namespace
}  // namespace memfit::kernels
