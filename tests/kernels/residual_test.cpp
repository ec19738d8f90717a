// Element-wise sums: the residual reference against finite differences, the fast kernels
// (including aliased outputs) against the double references, and typed errors.
#include "memfit/kernels/cpu/residual.h"

#include <gtest/gtest.h>

#include "memfit/kernels/ref/residual_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

TEST(ResidualRef, BackwardMatchesFiniteDifferences) {
  const int64_t n = 11;
  std::vector<double> a = random_values(n, 1), b = random_values(n, 2), wout = random_values(n, 3);
  std::vector<double> out(n);
  auto loss = [&] {
    ref::residual_forward_ref(out.data(), a.data(), b.data(), n);
    return dot(out, wout);
  };
  std::vector<double> da(n, 0.0), db(n, 0.0);
  ref::residual_backward_ref(da.data(), db.data(), wout.data(), n);
  EXPECT_TRUE(all_close(da, numeric_grad(loss, a), 1e-6, 1e-9));
  EXPECT_TRUE(all_close(db, numeric_grad(loss, b), 1e-6, 1e-9));
}

class ResidualFast : public ::testing::TestWithParam<int64_t> {};

TEST_P(ResidualFast, MatchesReference) {
  const int64_t n = GetParam();
  MemoryPool pool;
  std::vector<double> a, b;
  Tensor ta = random_tensor(pool, {n}, 41, &a), tb = random_tensor(pool, {n}, 42, &b);
  Tensor out = make_tensor(pool, {n});
  std::vector<double> want(n);
  ref::residual_forward_ref(want.data(), a.data(), b.data(), n);
  residual_forward(out, ta, tb);
  // One float rounding of an exact double sum: within half an ulp.
  EXPECT_TRUE(all_close(to_doubles(out), want, 6e-8, 0)) << "residual_forward";
  residual_forward(ta, ta, tb);  // out aliases a
  EXPECT_EQ(to_doubles(ta), to_doubles(out));

  Tensor dst = random_tensor(pool, {n}, 43, &a);
  std::vector<double> acc = a;
  ref::add_inplace_ref(acc.data(), b.data(), n);
  add_inplace(dst, tb);
  EXPECT_TRUE(all_close(to_doubles(dst), acc, 6e-8, 0)) << "add_inplace";

  std::vector<double> scaled = acc;
  ref::scale_inplace_ref(scaled.data(), 0.125, n);  // a power of two: exact
  scale_inplace(dst, 0.125f);
  EXPECT_TRUE(all_close(to_doubles(dst), scaled, 6e-8, 0)) << "scale_inplace";

  // Float squares are exact in double; only the order of the double additions differs.
  const std::vector<double> d = to_doubles(dst);
  EXPECT_NEAR(sum_squares(dst), ref::sum_squares_ref(d.data(), n),
              1e-13 * ref::sum_squares_ref(d.data(), n));
}

INSTANTIATE_TEST_SUITE_P(Sizes, ResidualFast, ::testing::Values(1, 15, 16, 17, 1000, 100003));

TEST(Residual, AddInplaceTakesAnyShapeOfTheSameSize) {
  MemoryPool pool;
  Tensor dst = make_tensor(pool, {2, 6}), src = random_tensor(pool, {12}, 1);
  add_inplace(dst, src);
  EXPECT_EQ(to_doubles(dst), to_doubles(src));
}

TEST(Residual, ShapeAndDTypeErrors) {
  MemoryPool pool;
  Tensor a = make_tensor(pool, {4, 8}), b = make_tensor(pool, {8, 4}),
         out = make_tensor(pool, {4, 8});
  EXPECT_TRUE(throws_with<ShapeError>([&] { residual_forward(out, a, b); },
                                      {"[residual_forward]", "(4, 8)", "(8, 4)"}));
  Tensor small = make_tensor(pool, {31});
  EXPECT_TRUE(throws_with<ShapeError>([&] { add_inplace(a, small); },
                                      {"[add_inplace]", "(4, 8)", "(31,)"}));
  Tensor h = make_tensor(pool, {4, 8}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { residual_forward(out, a, h); },
                                      {"[residual_forward]", "b", "bf16"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { sum_squares(h); }, {"[sum_squares]", "bf16"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { scale_inplace(h, 2.0f); }, {"[scale_inplace]"}));
}

}  // namespace
}  // namespace memfit::kernels
