// RMSNorm in mixed precision: a bf16 / f16 output is exactly the f32 output rounded to nearest
// even (the same arithmetic, one rounding on store), a bf16 / f16 weight gives exactly what an
// f32 one holding the same values gives, in forward and backward; both against the double
// reference with the tolerance of the output type; and the dtype errors.
#include <gtest/gtest.h>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/rmsnorm.h"
#include "memfit/kernels/ref/rmsnorm_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

const Shape kShapes[] = {{1, 1}, {3, 5}, {7, 17}, {4, 33}, {64, 768}, {2, 3, 100}};
constexpr float kEps = 1e-6f;

TEST(RmsNormMixed, HalfOutputIsTheF32OutputRounded) {
  MemoryPool pool;
  for (const Shape& shape : kShapes) {
    const int64_t C = shape[-1], R = shape.numel() / C;
    std::vector<double> x, w;
    Tensor inp = random_tensor(pool, shape, 11, &x, -3.0, 2.0);
    Tensor weight = random_tensor(pool, {C}, 12, &w, 0.5, 1.5);
    Tensor out32 = make_tensor(pool, shape), rstd32 = make_tensor(pool, {R});
    rmsnorm_forward(out32, rstd32, inp, weight, kEps);
    std::vector<double> want(shape.numel()), rr(R);
    ref::rmsnorm_forward_ref(want.data(), rr.data(), x.data(), w.data(), R, C, kEps);
    for (DType t : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(fmt::format("{} {}", shape.to_string(), dtype_name(t)));
      Tensor out = random_any(pool, shape, t, 3), rstd = make_tensor(pool, {R});
      rmsnorm_forward(out, rstd, inp, weight, kEps);
      Tensor rounded32 = make_tensor(pool, shape, t);
      convert(rounded32, out32);
      EXPECT_EQ(std::memcmp(out.raw_data(), rounded32.raw_data(), out.nbytes()), 0);
      EXPECT_EQ(to_doubles(rstd), to_doubles(rstd32));
      // Against double: the f32 kernel's error (1e-5) plus one rounding to t.
      EXPECT_TRUE(all_close(to_doubles_any(out), want, unit_roundoff(t) + 1e-5, 2e-6));
    }
  }
}

// Note [Recomputed norms]: the recomputed output is the forward's, bit for bit, in every
// output type and with a half weight.
TEST(RmsNormMixed, ApplyFromSavedRstdIsTheForwardBitForBit) {
  MemoryPool pool;
  for (const Shape& shape : kShapes) {
    const int64_t C = shape[-1], R = shape.numel() / C;
    Tensor inp = random_tensor(pool, shape, 21, nullptr, -3.0, 2.0);
    for (DType wt : {DType::f32, DType::bf16})
      for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        SCOPED_TRACE(fmt::format("{} out {} weight {}", shape.to_string(), dtype_name(t),
                                 dtype_name(wt)));
        Tensor weight = random_any(pool, {C}, wt, 22);
        Tensor out = random_any(pool, shape, t, 3), again = random_any(pool, shape, t, 4);
        Tensor rstd = make_tensor(pool, {R});
        rmsnorm_forward(out, rstd, inp, weight, kEps);
        rmsnorm_apply(again, inp, weight, rstd);
        EXPECT_EQ(std::memcmp(out.raw_data(), again.raw_data(), out.nbytes()), 0);
      }
  }
}

TEST(RmsNormMixed, HalfWeightActsAsItsF32Values) {
  MemoryPool pool;
  for (const Shape& shape : kShapes) {
    const int64_t C = shape[-1], R = shape.numel() / C;
    for (DType t : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(fmt::format("{} {}", shape.to_string(), dtype_name(t)));
      std::vector<double> w;
      Tensor inp = random_tensor(pool, shape, 11, nullptr, -3.0, 2.0);
      Tensor weight = random_any(pool, {C}, t, 12, &w, 0.5, 1.5);
      Tensor weight32 = make_tensor(pool, {C});
      copy_in(weight32, w);
      Tensor out = make_tensor(pool, shape, DType::bf16),
             out32 = make_tensor(pool, shape, DType::bf16);
      Tensor rstd = make_tensor(pool, {R});
      rmsnorm_forward(out, rstd, inp, weight, kEps);
      rmsnorm_forward(out32, rstd, inp, weight32, kEps);
      EXPECT_EQ(std::memcmp(out.raw_data(), out32.raw_data(), out.nbytes()), 0);

      Tensor dout = random_tensor(pool, shape, 14);
      Tensor dinp = make_tensor(pool, shape), dw = make_tensor(pool, {C});
      Tensor dinp32 = make_tensor(pool, shape), dw32 = make_tensor(pool, {C});
      for (Tensor* g : {&dinp, &dinp32}) copy_in(*g, std::vector<double>(shape.numel(), 0.0));
      for (Tensor* g : {&dw, &dw32}) copy_in(*g, std::vector<double>(C, 0.0));
      rmsnorm_backward(dinp, dw, dout, inp, weight, rstd);
      rmsnorm_backward(dinp32, dw32, dout, inp, weight32, rstd);
      EXPECT_EQ(to_doubles(dinp), to_doubles(dinp32));
      EXPECT_EQ(to_doubles(dw), to_doubles(dw32));
    }
  }
}

TEST(RmsNormMixed, DTypeErrors) {
  MemoryPool pool;
  Tensor inp = make_tensor(pool, {4, 8}), w = make_tensor(pool, {8}, DType::bf16),
         rstd = make_tensor(pool, {4});
  Tensor out_i = make_tensor(pool, {4, 8}, DType::i32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { rmsnorm_forward(out_i, rstd, inp, w, 1e-5f); },
                                      {"[rmsnorm_forward]", "out", "f32, bf16 or f16", "i32"}));
  Tensor w_i = make_tensor(pool, {8}, DType::i8), out = make_tensor(pool, {4, 8}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { rmsnorm_forward(out, rstd, inp, w_i, 1e-5f); },
                                      {"[rmsnorm_forward]", "weight", "i8"}));
  Tensor inp16 = make_tensor(pool, {4, 8}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { rmsnorm_forward(out, rstd, inp16, w, 1e-5f); },
                                      {"[rmsnorm_forward]", "inp", "f32", "f16"}));
  Tensor rstd16 = make_tensor(pool, {4}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { rmsnorm_forward(out, rstd16, inp, w, 1e-5f); },
                                      {"[rmsnorm_forward]", "rstd", "f32", "f16"}));
  Tensor dout_bf = make_tensor(pool, {4, 8}, DType::bf16), dinp = make_tensor(pool, {4, 8}),
         dw = make_tensor(pool, {8});
  EXPECT_TRUE(throws_with<DTypeError>([&] { rmsnorm_backward(dinp, dw, dout_bf, inp, w, rstd); },
                                      {"[rmsnorm_backward]", "dout", "f32", "bf16"}));
}

}  // namespace
}  // namespace memfit::kernels
