// SwiGLU in mixed precision: for every combination of f32, bf16 and f16 tensors, the result is
// exactly what the f32 kernel gives on the widened inputs, rounded once to the output type;
// against the double reference within the output type's unit roundoff; in place over gate_up
// in bf16 and f16; and the dtype errors.
#include <gtest/gtest.h>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/swiglu.h"
#include "memfit/kernels/ref/swiglu_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;
using NF = std::pair<int64_t, int64_t>;  // (N, F) of the output

constexpr DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

class SwigluMixed : public ::testing::TestWithParam<NF> {};

TEST_P(SwigluMixed, EqualsTheF32KernelRoundedOnce) {
  const auto [N, F] = GetParam();
  MemoryPool pool;
  for (DType xt : kTypes) {
    std::vector<double> gu, dy;
    // |g| <= 8: f16 holds every product (dg, du) without overflow.
    Tensor gate_up = random_any(pool, {N, 2 * F}, xt, 61, &gu, -8, 8);
    Tensor gate_up32 = as(pool, gate_up, DType::f32);
    std::vector<double> want(N * F);
    ref::swiglu_forward_ref(want.data(), gu.data(), N, F);
    Tensor out32 = make_tensor(pool, {N, F});
    swiglu_forward(out32, gate_up32);
    for (DType ot : kTypes) {
      SCOPED_TRACE(fmt::format("forward {}x{} gate_up {} out {}", N, F, dtype_name(xt),
                               dtype_name(ot)));
      Tensor out = make_tensor(pool, {N, F}, ot);
      swiglu_forward(out, gate_up);
      EXPECT_TRUE(same_bits(out, as(pool, out32, ot)));
      EXPECT_TRUE(all_close(to_doubles_any(out), want, unit_roundoff(ot) + 2e-6, 1e-6));
    }
    for (DType gt : kTypes) {
      Tensor dout = random_any(pool, {N, F}, gt, 62, &dy);
      Tensor d32 = make_tensor(pool, {N, 2 * F});
      swiglu_backward(d32, as(pool, dout, DType::f32), gate_up32);
      std::vector<double> dwant(N * 2 * F);
      ref::swiglu_backward_ref(dwant.data(), dy.data(), gu.data(), N, F);
      for (DType dt : kTypes) {
        SCOPED_TRACE(fmt::format("backward {}x{} gate_up {} dout {} dgate_up {}", N, F,
                                 dtype_name(xt), dtype_name(gt), dtype_name(dt)));
        Tensor dgu = make_tensor(pool, {N, 2 * F}, dt);
        swiglu_backward(dgu, dout, gate_up);
        EXPECT_TRUE(same_bits(dgu, as(pool, d32, dt)));
        EXPECT_TRUE(all_close(to_doubles_any(dgu), dwant, unit_roundoff(dt) + 4e-6, 2e-6));
        if (dt == xt) {  // in place over gate_up
          Tensor g = as(pool, gate_up, xt);
          swiglu_backward(g, dout, g);
          EXPECT_TRUE(same_bits(g, dgu));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwigluMixed,
                         ::testing::Values(NF{1, 1}, NF{3, 17}, NF{9, 2003}),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "x" +
                                  std::to_string(info.param.second);
                         });

TEST(SwigluMixed, IntegerTensorsAreDTypeErrors) {
  MemoryPool pool;
  Tensor gu = make_tensor(pool, {4, 16}, DType::bf16), dgu = make_tensor(pool, {4, 16});
  Tensor i32 = make_tensor(pool, {4, 8}, DType::i32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { swiglu_backward(dgu, i32, gu); },
                                      {"[swiglu_backward]", "dout", "i32"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { swiglu_forward(i32, gu); },
                                      {"[swiglu_forward]", "out", "i32"}));
}

}  // namespace
}  // namespace memfit::kernels
