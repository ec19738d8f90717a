// GELU in mixed precision: for every combination of f32, bf16 and f16 tensors, the result is
// exactly what the f32 kernel gives on the widened inputs, rounded once to the output type
// (the same arithmetic in f32); against the double reference within the output type's unit
// roundoff; in place in bf16 and f16; and the dtype errors. (The Tensor API cannot alias two
// dtypes, so the kernel's check against a narrower dinp over a wider dout is not reachable here.)
#include <gtest/gtest.h>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/gelu.h"
#include "memfit/kernels/ref/gelu_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

constexpr DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

class GeluMixed : public ::testing::TestWithParam<int64_t> {};

TEST_P(GeluMixed, EqualsTheF32KernelRoundedOnce) {
  const int64_t n = GetParam();
  MemoryPool pool;
  for (DType xt : kTypes) {
    std::vector<double> x, dy;
    Tensor inp = random_any(pool, {n}, xt, 31, &x, -8, 8);
    Tensor inp32 = as(pool, inp, DType::f32);
    std::vector<double> want(n);
    ref::gelu_forward_ref(want.data(), x.data(), n);
    Tensor out32 = make_tensor(pool, {n});
    gelu_forward(out32, inp32);
    for (DType ot : kTypes) {
      SCOPED_TRACE(fmt::format("forward n={} inp {} out {}", n, dtype_name(xt), dtype_name(ot)));
      Tensor out = make_tensor(pool, {n}, ot);
      gelu_forward(out, inp);
      EXPECT_TRUE(same_bits(out, as(pool, out32, ot)));
      EXPECT_TRUE(all_close(to_doubles_any(out), want, unit_roundoff(ot) + 2e-6, 1e-6));
    }
    for (DType gt : kTypes) {
      Tensor dout = random_any(pool, {n}, gt, 32, &dy);
      Tensor din32 = make_tensor(pool, {n});
      gelu_backward(din32, inp32, as(pool, dout, DType::f32));
      std::vector<double> dwant(n);
      ref::gelu_backward_ref(dwant.data(), x.data(), dy.data(), n);
      for (DType dt : kTypes) {
        SCOPED_TRACE(fmt::format("backward n={} inp {} dout {} dinp {}", n, dtype_name(xt),
                                 dtype_name(gt), dtype_name(dt)));
        Tensor dinp = make_tensor(pool, {n}, dt);
        gelu_backward(dinp, inp, dout);
        EXPECT_TRUE(same_bits(dinp, as(pool, din32, dt)));
        EXPECT_TRUE(all_close(to_doubles_any(dinp), dwant, unit_roundoff(dt) + 2e-6, 1e-6));
        if (dt == gt) {  // in place, as the MLP's backward runs it
          Tensor d = as(pool, dout, gt);
          gelu_backward(d, inp, d);
          EXPECT_TRUE(same_bits(d, dinp));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GeluMixed, ::testing::Values(1, 17, 20011));

TEST(GeluMixed, IntegerTensorsAreDTypeErrors) {
  MemoryPool pool;
  Tensor inp = make_tensor(pool, {64}, DType::bf16), g32 = make_tensor(pool, {64});
  Tensor i32 = make_tensor(pool, {64}, DType::i32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { gelu_backward(g32, inp, i32); },
                                      {"[gelu_backward]", "dout", "i32"}));
  EXPECT_TRUE(
      throws_with<DTypeError>([&] { gelu_forward(i32, inp); }, {"[gelu_forward]", "out", "i32"}));
}

}  // namespace
}  // namespace memfit::kernels
