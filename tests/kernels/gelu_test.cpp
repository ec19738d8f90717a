// GELU: the double reference against finite differences, the fast kernel against the reference
// (including the aliased dinp == dout form the model uses), and typed errors.
#include "memfit/kernels/cpu/gelu.h"

#include <gtest/gtest.h>

#include "memfit/kernels/ref/gelu_ref.h"
#include "mixed_test_util.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

TEST(GeluRef, BackwardMatchesFiniteDifferences) {
  const int64_t n = 13;
  std::vector<double> x = random_values(n, 1, -4, 4), wout = random_values(n, 2);
  x[0] = 0.0;
  std::vector<double> out(n);
  auto loss = [&] {
    ref::gelu_forward_ref(out.data(), x.data(), n);
    return dot(out, wout);
  };
  std::vector<double> dx(n);
  ref::gelu_backward_ref(dx.data(), x.data(), wout.data(), n);
  EXPECT_TRUE(all_close(dx, numeric_grad(loss, x), 1e-6, 1e-9));
}

class GeluFast : public ::testing::TestWithParam<int64_t> {};

TEST_P(GeluFast, MatchesReference) {
  const int64_t n = GetParam();
  MemoryPool pool;
  std::vector<double> x, dy;
  // Wide enough to reach both branches of tanh and GELU's flat negative tail.
  Tensor inp = random_tensor(pool, {n}, 31, &x, -10, 10);
  Tensor dout = random_tensor(pool, {n}, 32, &dy);
  Tensor out = make_tensor(pool, {n}), dinp = make_tensor(pool, {n});

  std::vector<double> want(n), dwant(n);
  ref::gelu_forward_ref(want.data(), x.data(), n);
  ref::gelu_backward_ref(dwant.data(), x.data(), dy.data(), n);
  gelu_forward(out, inp);
  EXPECT_TRUE(all_close(to_doubles(out), want, 2e-6, 1e-6)) << "forward";
  gelu_backward(dinp, inp, dout);
  EXPECT_TRUE(all_close(to_doubles(dinp), dwant, 2e-6, 1e-6)) << "backward";
  // In place over dout, as the MLP's backward calls it.
  gelu_backward(dout, inp, dout);
  EXPECT_EQ(to_doubles(dout), to_doubles(dinp));
}

TEST_P(GeluFast, RecomputeBackwardIsForwardThenBackwardBitForBit) {
  // In every storage type the model uses: f32, and the pre-activation, GELU and gradient in
  // bf16 (mixed precision) or f16.
  const int64_t n = GetParam();
  MemoryPool pool;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor inp = random_any(pool, {n}, t, 41, nullptr, -10, 10);
    Tensor dout = random_any(pool, {n}, t, 42);
    Tensor out_two = make_tensor(pool, {n}, t), dinp_two = make_tensor(pool, {n}, t);
    gelu_forward(out_two, inp);
    gelu_backward(dinp_two, inp, dout);
    Tensor out_one = make_tensor(pool, {n}, t);
    gelu_recompute_backward(out_one, dout, inp);  // dout becomes dinp
    EXPECT_TRUE(same_bits(out_one, out_two));
    EXPECT_TRUE(same_bits(dout, dinp_two));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GeluFast, ::testing::Values(1, 15, 16, 17, 1000, 100003));

TEST(Gelu, ShapeAndDTypeErrors) {
  MemoryPool pool;
  Tensor inp = make_tensor(pool, {4, 12}), out_bad = make_tensor(pool, {4, 13});
  EXPECT_TRUE(throws_with<ShapeError>([&] { gelu_forward(out_bad, inp); },
                                      {"[gelu_forward]", "out", "(4, 12)", "(4, 13)"}));
  Tensor dout = make_tensor(pool, {48}), dinp = make_tensor(pool, {4, 12});
  EXPECT_TRUE(throws_with<ShapeError>([&] { gelu_backward(dinp, inp, dout); },
                                      {"[gelu_backward]", "dout", "(4, 12)", "(48,)"}));
  // bf16 and f16 are supported (gelu_mixed_test.cpp); integer tensors are not.
  Tensor inp_i32 = make_tensor(pool, {4, 12}, DType::i32), out = make_tensor(pool, {4, 12});
  EXPECT_TRUE(throws_with<DTypeError>([&] { gelu_forward(out, inp_i32); },
                                      {"[gelu_forward]", "inp", "i32"}));
}

}  // namespace
}  // namespace memfit::kernels
