// LayerNorm in mixed precision: a bf16 / f16 output is exactly the f32 output rounded to nearest
// even (the same arithmetic, one rounding on store), a bf16 / f16 weight and bias give exactly
// what f32 ones holding the same values give, in forward and backward; both against the double
// reference with the tolerance of the output type; and the dtype errors.
#include <gtest/gtest.h>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/layernorm.h"
#include "memfit/kernels/ref/layernorm_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

const Shape kShapes[] = {{1, 1}, {3, 5}, {7, 17}, {4, 33}, {64, 768}, {2, 3, 100}};

TEST(LayerNormMixed, HalfOutputIsTheF32OutputRounded) {
  MemoryPool pool;
  for (const Shape& shape : kShapes) {
    const int64_t C = shape[-1], R = shape.numel() / C;
    std::vector<double> x, w, b;
    Tensor inp = random_tensor(pool, shape, 11, &x, 2.0, 5.0);
    Tensor weight = random_tensor(pool, {C}, 12, &w, 0.5, 1.5);
    Tensor bias = random_tensor(pool, {C}, 13, &b);
    Tensor out32 = make_tensor(pool, shape), mean32 = make_tensor(pool, {R}),
           rstd32 = make_tensor(pool, {R});
    layernorm_forward(out32, mean32, rstd32, inp, weight, bias);
    std::vector<double> want(shape.numel()), mr(R), rr(R);
    ref::layernorm_forward_ref(want.data(), mr.data(), rr.data(), x.data(), w.data(), b.data(), R,
                               C);
    for (DType t : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(fmt::format("{} {}", shape.to_string(), dtype_name(t)));
      Tensor out = random_any(pool, shape, t, 3), mean = make_tensor(pool, {R}),
             rstd = make_tensor(pool, {R});
      layernorm_forward(out, mean, rstd, inp, weight, bias);
      Tensor rounded32 = make_tensor(pool, shape, t);
      convert(rounded32, out32);
      EXPECT_EQ(std::memcmp(out.raw_data(), rounded32.raw_data(), out.nbytes()), 0);
      EXPECT_EQ(to_doubles(mean), to_doubles(mean32));
      EXPECT_EQ(to_doubles(rstd), to_doubles(rstd32));
      // Against double: the f32 kernel's error (1e-5) plus one rounding to t.
      EXPECT_TRUE(all_close(to_doubles_any(out), want, unit_roundoff(t) + 1e-5, 2e-6));
    }
  }
}

// Note [Recomputed norms]: the blocks recompute their LayerNorm outputs in backward from the
// saved input and statistics; that must give the forward's bits, in every output type and with
// half weights, or FP32 training would no longer match a run that saved them.
TEST(LayerNormMixed, ApplyFromSavedStatisticsIsTheForwardBitForBit) {
  MemoryPool pool;
  for (const Shape& shape : kShapes) {
    const int64_t C = shape[-1], R = shape.numel() / C;
    Tensor inp = random_tensor(pool, shape, 21, nullptr, 2.0, 5.0);
    for (DType wt : {DType::f32, DType::bf16})
      for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        SCOPED_TRACE(fmt::format("{} out {} weight {}", shape.to_string(), dtype_name(t),
                                 dtype_name(wt)));
        Tensor weight = random_any(pool, {C}, wt, 22), bias = random_any(pool, {C}, wt, 23);
        Tensor out = random_any(pool, shape, t, 3), again = random_any(pool, shape, t, 4);
        Tensor mean = make_tensor(pool, {R}), rstd = make_tensor(pool, {R});
        layernorm_forward(out, mean, rstd, inp, weight, bias);
        layernorm_apply(again, inp, weight, bias, mean, rstd);
        EXPECT_EQ(std::memcmp(out.raw_data(), again.raw_data(), out.nbytes()), 0);
      }
  }
}

TEST(LayerNormMixed, HalfWeightsActAsTheirF32Values) {
  MemoryPool pool;
  for (const Shape& shape : kShapes) {
    const int64_t C = shape[-1], R = shape.numel() / C;
    for (DType t : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(fmt::format("{} {}", shape.to_string(), dtype_name(t)));
      std::vector<double> w, b, dy;
      Tensor inp = random_tensor(pool, shape, 11, nullptr, 2.0, 5.0);
      Tensor weight = random_any(pool, {C}, t, 12, &w, 0.5, 1.5);
      Tensor bias = random_any(pool, {C}, t, 13, &b);
      Tensor weight32 = make_tensor(pool, {C}), bias32 = make_tensor(pool, {C});
      copy_in(weight32, w);
      copy_in(bias32, b);
      Tensor out = make_tensor(pool, shape, DType::bf16),
             out32 = make_tensor(pool, shape, DType::bf16);
      Tensor mean = make_tensor(pool, {R}), rstd = make_tensor(pool, {R});
      layernorm_forward(out, mean, rstd, inp, weight, bias);
      layernorm_forward(out32, mean, rstd, inp, weight32, bias32);
      EXPECT_EQ(std::memcmp(out.raw_data(), out32.raw_data(), out.nbytes()), 0);

      Tensor dout = random_tensor(pool, shape, 14, &dy);
      Tensor dinp = make_tensor(pool, shape), dw = make_tensor(pool, {C}),
             db = make_tensor(pool, {C});
      Tensor dinp32 = make_tensor(pool, shape), dw32 = make_tensor(pool, {C}),
             db32 = make_tensor(pool, {C});
      layernorm_backward(dinp, dw, db, dout, inp, weight, mean, rstd);
      layernorm_backward(dinp32, dw32, db32, dout, inp, weight32, mean, rstd);
      EXPECT_EQ(to_doubles(dinp), to_doubles(dinp32));
      EXPECT_EQ(to_doubles(dw), to_doubles(dw32));
      EXPECT_EQ(to_doubles(db), to_doubles(db32));
    }
  }
}

TEST(LayerNormMixed, DTypeErrors) {
  MemoryPool pool;
  Tensor inp = make_tensor(pool, {4, 8}), w = make_tensor(pool, {8}, DType::bf16),
         b = make_tensor(pool, {8}), mean = make_tensor(pool, {4}), rstd = make_tensor(pool, {4});
  Tensor out_i = make_tensor(pool, {4, 8}, DType::i32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { layernorm_forward(out_i, mean, rstd, inp, w, b); },
                                      {"[layernorm_forward]", "out", "f32, bf16 or f16", "i32"}));
  Tensor w_i = make_tensor(pool, {8}, DType::i8), out = make_tensor(pool, {4, 8}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { layernorm_forward(out, mean, rstd, inp, w_i, b); },
                                      {"[layernorm_forward]", "weight", "i8"}));
  Tensor inp16 = make_tensor(pool, {4, 8}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { layernorm_forward(out, mean, rstd, inp16, w, b); },
                                      {"[layernorm_forward]", "inp", "f32", "f16"}));
  Tensor dout_bf = make_tensor(pool, {4, 8}, DType::bf16), dinp = make_tensor(pool, {4, 8}),
         dw = make_tensor(pool, {8}), db = make_tensor(pool, {8});
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { layernorm_backward(dinp, dw, db, dout_bf, inp, w, mean, rstd); },
      {"[layernorm_backward]", "dout", "f32", "bf16"}));
}

}  // namespace
}  // namespace memfit::kernels
