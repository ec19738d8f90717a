// LayerNorm: the double reference against finite differences, the fast kernel against the
// reference over odd and GPT-2 shapes, the accumulate-into-dinp convention, and typed errors.
#include "memfit/kernels/cpu/layernorm.h"

#include <gtest/gtest.h>

#include "memfit/kernels/ref/layernorm_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

// loss = sum(out * wout): its gradient with respect to out is wout.
TEST(LayerNormRef, BackwardMatchesFiniteDifferences) {
  for (auto [R, C] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}, {3, 7}, {1, 16}}) {
    const size_t n = static_cast<size_t>(R * C);
    std::vector<double> x = random_values(n, 1, -2, 2), w = random_values(C, 2, 0.5, 1.5),
                        b = random_values(C, 3), wout = random_values(n, 4);
    std::vector<double> out(n), mean(R), rstd(R);
    auto loss = [&] {
      ref::layernorm_forward_ref(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                 R, C);
      return dot(out, wout);
    };
    loss();
    std::vector<double> dx(n, 0.0), dw(C, 0.0), db(C, 0.0);
    ref::layernorm_backward_ref(dx.data(), dw.data(), db.data(), wout.data(), x.data(), w.data(),
                                mean.data(), rstd.data(), R, C);
    EXPECT_TRUE(all_close(dx, numeric_grad(loss, x), 1e-6, 1e-8)) << R << "x" << C << " dinp";
    EXPECT_TRUE(all_close(dw, numeric_grad(loss, w), 1e-6, 1e-8)) << R << "x" << C << " dweight";
    EXPECT_TRUE(all_close(db, numeric_grad(loss, b), 1e-6, 1e-8)) << R << "x" << C << " dbias";
  }
}

struct LnCase {
  Shape shape;  // inp; C is the last dimension
};

class LayerNormFast : public ::testing::TestWithParam<LnCase> {};

TEST_P(LayerNormFast, MatchesReference) {
  MemoryPool pool;
  const Shape shape = GetParam().shape;
  const int64_t C = shape[-1], R = shape.numel() / C;
  const size_t n = static_cast<size_t>(R * C);
  std::vector<double> x, w, b, dy, dx0, dw0, db0;
  // An offset mean, as in a residual stream, exercises the two-pass variance.
  Tensor inp = random_tensor(pool, shape, 11, &x, 2.0, 5.0);
  Tensor weight = random_tensor(pool, {C}, 12, &w, 0.5, 1.5);
  Tensor bias = random_tensor(pool, {C}, 13, &b);
  Tensor out = make_tensor(pool, shape), mean = make_tensor(pool, {R}),
         rstd = make_tensor(pool, {R});
  layernorm_forward(out, mean, rstd, inp, weight, bias);

  std::vector<double> out_ref(n), mean_ref(R), rstd_ref(R);
  ref::layernorm_forward_ref(out_ref.data(), mean_ref.data(), rstd_ref.data(), x.data(), w.data(),
                             b.data(), R, C);
  EXPECT_TRUE(all_close(to_doubles(out), out_ref, 1e-5, 2e-6)) << shape.to_string() << " out";
  EXPECT_TRUE(all_close(to_doubles(mean), mean_ref, 1e-6, 1e-7)) << shape.to_string() << " mean";
  EXPECT_TRUE(all_close(to_doubles(rstd), rstd_ref, 2e-6, 0)) << shape.to_string() << " rstd";

  // Backward onto nonzero gradients: all three accumulate.
  Tensor dout = random_tensor(pool, shape, 14, &dy);
  Tensor dinp = random_tensor(pool, shape, 15, &dx0);
  Tensor dweight = random_tensor(pool, {C}, 16, &dw0);
  Tensor dbias = random_tensor(pool, {C}, 17, &db0);
  layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  std::vector<double> dx = dx0, dw = dw0, db = db0;
  ref::layernorm_backward_ref(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                              mean_ref.data(), rstd_ref.data(), R, C);
  const double grad_scale = max_abs(dx);
  EXPECT_TRUE(all_close(to_doubles(dinp), dx, 1e-5, 1e-5 * grad_scale))
      << shape.to_string() << " dinp";
  EXPECT_TRUE(all_close(to_doubles(dweight), dw, 1e-5, 1e-5 * max_abs(dw)))
      << shape.to_string() << " dweight";
  EXPECT_TRUE(all_close(to_doubles(dbias), db, 1e-5, 1e-5 * max_abs(db)))
      << shape.to_string() << " dbias";
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormFast,
                         ::testing::Values(LnCase{{1, 1}}, LnCase{{1, 768}}, LnCase{{3, 5}},
                                           LnCase{{7, 17}}, LnCase{{4, 33}}, LnCase{{2, 3, 100}},
                                           LnCase{{64, 768}}, LnCase{{257, 384}}),
                         [](const auto& info) {
                           std::string s;
                           for (int64_t d : info.param.shape) {
                             if (!s.empty()) s += 'x';
                             s += std::to_string(d);
                           }
                           return s;
                         });

TEST(LayerNorm, MeanAndRstdMayBeShapedLikeTheRows) {
  MemoryPool pool;
  Tensor inp = random_tensor(pool, {2, 3, 8}, 1);
  Tensor w = random_tensor(pool, {8}, 2), b = random_tensor(pool, {8}, 3);
  Tensor out = make_tensor(pool, {2, 3, 8}), mean = make_tensor(pool, {2, 3}),
         rstd = make_tensor(pool, {2, 3});
  EXPECT_NO_THROW(layernorm_forward(out, mean, rstd, inp, w, b));
}

TEST(LayerNorm, ShapeErrorsNameTheOpAndShapes) {
  MemoryPool pool;
  Tensor inp = make_tensor(pool, {4, 8}), w = make_tensor(pool, {8}), b = make_tensor(pool, {8});
  Tensor out = make_tensor(pool, {4, 8}), mean = make_tensor(pool, {4}),
         rstd = make_tensor(pool, {4});
  Tensor w_bad = make_tensor(pool, {7}), out_bad = make_tensor(pool, {4, 9}),
         mean_bad = make_tensor(pool, {5});
  EXPECT_TRUE(throws_with<ShapeError>([&] { layernorm_forward(out, mean, rstd, inp, w_bad, b); },
                                      {"[layernorm_forward]", "weight", "(8,)", "(7,)"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { layernorm_forward(out_bad, mean, rstd, inp, w, b); },
                                      {"[layernorm_forward]", "(4, 8)", "(4, 9)"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { layernorm_forward(out, mean_bad, rstd, inp, w, b); },
                                      {"[layernorm_forward]", "(5,)", "(4, 8)"}));
  Tensor dinp = make_tensor(pool, {4, 8}), dw = make_tensor(pool, {8}), db = make_tensor(pool, {8});
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] { layernorm_backward(dinp, dw, db, out_bad, inp, w, mean, rstd); },
      {"[layernorm_backward]", "dout", "(4, 9)"}));
}

TEST(LayerNorm, DTypeErrorsNameTheOp) {
  MemoryPool pool;
  Tensor inp = make_tensor(pool, {4, 8}, DType::bf16), w = make_tensor(pool, {8}),
         b = make_tensor(pool, {8});
  Tensor out = make_tensor(pool, {4, 8}), mean = make_tensor(pool, {4}),
         rstd = make_tensor(pool, {4});
  EXPECT_TRUE(throws_with<DTypeError>([&] { layernorm_forward(out, mean, rstd, inp, w, b); },
                                      {"[layernorm_forward]", "inp", "bf16"}));
}

}  // namespace
}  // namespace memfit::kernels
