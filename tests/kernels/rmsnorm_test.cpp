// RMSNorm: the double reference against finite differences, the fast kernel against the
// reference over odd and LLaMA shapes, the accumulate-into-dinp convention, and typed errors.
#include "memfit/kernels/cpu/rmsnorm.h"

#include <gtest/gtest.h>

#include "memfit/kernels/ref/rmsnorm_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

// loss = sum(out * wout): its gradient with respect to out is wout. A large eps as well as a
// Llama one, so that a backward that forgot eps would show.
TEST(RmsNormRef, BackwardMatchesFiniteDifferences) {
  for (double eps : {1e-6, 0.25}) {
    for (auto [R, C] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}, {3, 7}, {1, 16}}) {
      const size_t n = static_cast<size_t>(R * C);
      std::vector<double> x = random_values(n, 1, -2, 2), w = random_values(C, 2, 0.5, 1.5),
                          wout = random_values(n, 4);
      std::vector<double> out(n), rstd(R);
      auto loss = [&] {
        ref::rmsnorm_forward_ref(out.data(), rstd.data(), x.data(), w.data(), R, C, eps);
        return dot(out, wout);
      };
      loss();
      std::vector<double> dx(n, 0.0), dw(C, 0.0);
      ref::rmsnorm_backward_ref(dx.data(), dw.data(), wout.data(), x.data(), w.data(), rstd.data(),
                                R, C);
      EXPECT_TRUE(all_close(dx, numeric_grad(loss, x), 1e-6, 1e-8))
          << R << "x" << C << " eps " << eps << " dinp";
      EXPECT_TRUE(all_close(dw, numeric_grad(loss, w), 1e-6, 1e-8))
          << R << "x" << C << " eps " << eps << " dweight";
    }
  }
}

class RmsNormFast : public ::testing::TestWithParam<Shape> {};

TEST_P(RmsNormFast, MatchesReference) {
  MemoryPool pool;
  const Shape shape = GetParam();
  const int64_t C = shape[-1], R = shape.numel() / C;
  const size_t n = static_cast<size_t>(R * C);
  constexpr float kEps = 1e-5f;
  std::vector<double> x, w, dy, dx0, dw0;
  Tensor inp = random_tensor(pool, shape, 11, &x, -3.0, 2.0);
  Tensor weight = random_tensor(pool, {C}, 12, &w, 0.5, 1.5);
  Tensor out = make_tensor(pool, shape), rstd = make_tensor(pool, {R});
  rmsnorm_forward(out, rstd, inp, weight, kEps);

  std::vector<double> out_ref(n), rstd_ref(R);
  ref::rmsnorm_forward_ref(out_ref.data(), rstd_ref.data(), x.data(), w.data(), R, C, kEps);
  EXPECT_TRUE(all_close(to_doubles(out), out_ref, 1e-5, 2e-6)) << shape.to_string() << " out";
  EXPECT_TRUE(all_close(to_doubles(rstd), rstd_ref, 2e-6, 0)) << shape.to_string() << " rstd";

  // Backward onto nonzero gradients: both accumulate.
  Tensor dout = random_tensor(pool, shape, 14, &dy);
  Tensor dinp = random_tensor(pool, shape, 15, &dx0);
  Tensor dweight = random_tensor(pool, {C}, 16, &dw0);
  rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
  std::vector<double> dx = dx0, dw = dw0;
  ref::rmsnorm_backward_ref(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd_ref.data(),
                            R, C);
  EXPECT_TRUE(all_close(to_doubles(dinp), dx, 1e-5, 1e-5 * max_abs(dx)))
      << shape.to_string() << " dinp";
  EXPECT_TRUE(all_close(to_doubles(dweight), dw, 1e-5, 1e-5 * max_abs(dw)))
      << shape.to_string() << " dweight";
}

// C = 1, odd C below and above a vector of 8 and 16 floats, TinyLlama's 2048, a 3-D input.
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormFast,
                         ::testing::Values(Shape{1, 1}, Shape{3, 5}, Shape{7, 17}, Shape{4, 33},
                                           Shape{2, 3, 100}, Shape{5, 2048}, Shape{257, 384}),
                         [](const auto& info) {
                           std::string s;
                           for (int64_t d : info.param) {
                             if (!s.empty()) s += 'x';
                             s += std::to_string(d);
                           }
                           return s;
                         });

// A zero row: rstd = 1/sqrt(eps), out = 0, and the backward stays finite.
TEST(RmsNorm, ZeroRowGivesOneOverSqrtEps) {
  MemoryPool pool;
  Tensor inp = make_tensor(pool, {2, 24}), w = random_tensor(pool, {24}, 2);
  copy_in(inp, std::vector<double>(48, 0.0));
  Tensor out = make_tensor(pool, {2, 24}), rstd = make_tensor(pool, {2});
  rmsnorm_forward(out, rstd, inp, w, 1e-6f);
  EXPECT_EQ(to_doubles(out), std::vector<double>(48, 0.0));
  EXPECT_NEAR(to_doubles(rstd)[0], 1000.0, 1e-3);
  Tensor dout = random_tensor(pool, {2, 24}, 3), dinp = make_tensor(pool, {2, 24}),
         dw = make_tensor(pool, {24});
  copy_in(dinp, std::vector<double>(48, 0.0));
  copy_in(dw, std::vector<double>(24, 0.0));
  rmsnorm_backward(dinp, dw, dout, inp, w, rstd);
  for (double v : to_doubles(dinp)) EXPECT_TRUE(std::isfinite(v));
}

TEST(RmsNorm, RstdMayBeShapedLikeTheRows) {
  MemoryPool pool;
  Tensor inp = random_tensor(pool, {2, 3, 8}, 1), w = random_tensor(pool, {8}, 2);
  Tensor out = make_tensor(pool, {2, 3, 8}), rstd = make_tensor(pool, {2, 3});
  EXPECT_NO_THROW(rmsnorm_forward(out, rstd, inp, w, 1e-5f));
}

TEST(RmsNorm, ShapeErrorsNameTheOpAndShapes) {
  MemoryPool pool;
  Tensor inp = make_tensor(pool, {4, 8}), w = make_tensor(pool, {8});
  Tensor out = make_tensor(pool, {4, 8}), rstd = make_tensor(pool, {4});
  Tensor w_bad = make_tensor(pool, {7}), out_bad = make_tensor(pool, {4, 9}),
         rstd_bad = make_tensor(pool, {5});
  EXPECT_TRUE(throws_with<ShapeError>([&] { rmsnorm_forward(out, rstd, inp, w_bad, 1e-5f); },
                                      {"[rmsnorm_forward]", "weight", "(8,)", "(7,)"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { rmsnorm_forward(out_bad, rstd, inp, w, 1e-5f); },
                                      {"[rmsnorm_forward]", "(4, 8)", "(4, 9)"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { rmsnorm_forward(out, rstd_bad, inp, w, 1e-5f); },
                                      {"[rmsnorm_forward]", "(5,)", "(4, 8)"}));
  EXPECT_TRUE(throws_with<Error>([&] { rmsnorm_forward(out, rstd, inp, w, -1.0f); },
                                 {"[rmsnorm_forward]", "eps", "-1"}));
  Tensor dinp = make_tensor(pool, {4, 8}), dw = make_tensor(pool, {8}),
         dw_bad = make_tensor(pool, {9});
  EXPECT_TRUE(throws_with<ShapeError>([&] { rmsnorm_backward(dinp, dw, out_bad, inp, w, rstd); },
                                      {"[rmsnorm_backward]", "dout", "(4, 9)"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { rmsnorm_backward(dinp, dw_bad, out, inp, w, rstd); },
                                      {"[rmsnorm_backward]", "dweight", "(8,)", "(9,)"}));
}

}  // namespace
}  // namespace memfit::kernels
