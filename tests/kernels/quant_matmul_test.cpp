// The tiled matmuls of a quantized weight (kernels/cpu/quant_matmul.h), NF4 and int8, against
// "dequantize all of W with the reference, multiply in double" (ref::nf4_matmul_*,
// ref::int8_matmul_*), at shapes with partial tiles (OC, IC not multiples of 128) and NF4
// blocks that span rows, in f32 and bf16 (f32 and bf16 outputs). On this
// CPU bf16 runs oneDNN's bf16 GEMM where it has one and the widened f32 route under
// MEMFIT_MAX_ISA=avx2 (CTest's kernels-avx2 label) or avx512.
//
// Tolerances (each output element; S = sum over k of |a_k w_k|, K the inner size, u = 2^-24):
//   f32 compute: |got - want| <= K u S (the f32 sum's worst-case rounding; the products are
//                exact in double on both sides, so this is all that can differ);
//   bf16 compute, f32 out: the same (bf16 inputs and tile values are exact in f32);
//   bf16 out: that plus half a bf16 ulp of the result, 2^-8 |want|.
#include "memfit/kernels/cpu/quant_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using test::kWeightQuants;
using test::OwnedQuant;

struct Dims {
  int64_t R, IC, OC;
};
// Tiles of 128: OC 130 and 257 leave partial row tiles, IC 300 and 323 partial column tiles;
// IC 323 (odd) makes blocks span rows and rows start at odd nibbles.
const Dims kDims[] = {{1, 64, 64}, {7, 100, 130}, {33, 300, 257}, {16, 323, 129}, {5, 512, 384}};

// The reference products of the format.
void ref_forward(double* out, const double* inp, const QuantWeight& w, int64_t R, bool bf16) {
  if (w.format == WeightQuant::nf4)
    ref::nf4_matmul_forward(out, inp, w.nf4, R, bf16);
  else
    ref::int8_matmul_forward(out, inp, w.int8, R, bf16);
}
void ref_backward_input(double* dinp, const double* dout, const QuantWeight& w, int64_t R,
                        bool bf16) {
  if (w.format == WeightQuant::nf4)
    ref::nf4_matmul_backward_input(dinp, dout, w.nf4, R, bf16);
  else
    ref::int8_matmul_backward_input(dinp, dout, w.int8, R, bf16);
}

// An input of `type` with values in [-1, 1); `exact` receives them as doubles (bf16-rounded).
Tensor input(MemoryPool& pool, Shape shape, DType type, uint32_t seed, std::vector<double>& exact) {
  exact = test::random_values(static_cast<size_t>(shape.numel()), seed);
  Tensor t = test::make_tensor(pool, shape, type);
  for (size_t i = 0; i < exact.size(); ++i) {
    if (type == DType::f32) {
      t.data<float>()[i] = static_cast<float>(exact[i]);
    } else {
      const uint16_t h = bf16_from_f32(static_cast<float>(exact[i]));
      static_cast<uint16_t*>(t.raw_data())[i] = h;
      exact[i] = f32_from_bf16(h);
    }
  }
  return t;
}

std::vector<double> output(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype() == DType::f32 ? t.data<float>()[i]
                                   : f32_from_bf16(static_cast<const uint16_t*>(t.raw_data())[i]);
  return v;
}

Tensor scratch_for(MemoryPool& pool, int64_t R, int64_t IC, int64_t OC, DType compute) {
  const auto bytes = static_cast<int64_t>(quant_matmul_scratch_bytes(R, IC, OC, compute));
  return Tensor::empty(pool, {bytes}, DType::u8, Category::workspace, "ws.quant");
}

// |got - want| <= K u S (+ 2^-8 |want| for a bf16 output), S from the same operands.
::testing::AssertionResult within(const std::vector<double>& got, const std::vector<double>& want,
                                  const std::vector<double>& abs_sums, int64_t K, bool bf16_out) {
  const double u = std::ldexp(1.0, -24);
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = static_cast<double>(K) * u * abs_sums[i] +
                       (bf16_out ? std::ldexp(1.0, -8) * std::fabs(want[i]) : 0.0) + 1e-30;
    if (!(std::fabs(got[i] - want[i]) <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want "
                                           << want[i] << ", tolerance " << tol;
  }
  return ::testing::AssertionSuccess();
}

std::vector<double> abs_of(std::vector<double> v) {
  for (double& x : v) x = std::fabs(x);
  return v;
}

TEST(QuantMatmul, ForwardMatchesDequantizedReference) {
  MemoryPool pool;
  for (const WeightQuant format : kWeightQuants) {
    for (const Dims& d : kDims) {
      OwnedQuant q(format, d.OC, d.IC);
      q.quantize(pool, static_cast<uint32_t>(d.OC + d.IC));
      for (DType compute : {DType::f32, DType::bf16}) {
        for (DType out_type : {DType::f32, DType::bf16}) {
          if (compute == DType::f32 && out_type == DType::bf16) continue;
          SCOPED_TRACE(::testing::Message() << weight_quant_name(format) << " " << d.R << "x"
                                            << d.IC << "->" << d.OC << " "
                                            << dtype_name(compute) << " -> " << dtype_name(out_type)
                                            << (matmul_widens(compute) ? " (widened)" : ""));
          std::vector<double> x;
          Tensor inp = input(pool, {d.R, d.IC}, compute, 7, x);
          Tensor out = test::make_tensor(pool, {d.R, d.OC}, out_type);
          Tensor ws = scratch_for(pool, d.R, d.IC, d.OC, compute);
          quant_matmul_forward(out, inp, q.w, ws);
          const bool bf16 = compute == DType::bf16;
          std::vector<double> want(static_cast<size_t>(d.R * d.OC)), sums(want.size());
          ref_forward(want.data(), x.data(), q.w, d.R, bf16);
          // S: |x| @ |W|^T, from |W| = the reference's dequantization, in absolute value.
          const std::vector<float> w = test::dequantized(q.w, bf16);
          const std::vector<double> ax = abs_of(x);
          for (int64_t r = 0; r < d.R; ++r)
            for (int64_t o = 0; o < d.OC; ++o) {
              double s = 0.0;
              for (int64_t k = 0; k < d.IC; ++k) s += ax[r * d.IC + k] * std::fabs(w[o * d.IC + k]);
              sums[static_cast<size_t>(r * d.OC + o)] = s;
            }
          EXPECT_TRUE(within(output(out), want, sums, d.IC, out_type == DType::bf16));
        }
      }
    }
  }
}

TEST(QuantMatmul, InputGradientMatchesDequantizedReference) {
  MemoryPool pool;
  for (const WeightQuant format : kWeightQuants) {
    for (const Dims& d : kDims) {
      OwnedQuant q(format, d.OC, d.IC);
      q.quantize(pool, static_cast<uint32_t>(3 * d.OC + d.IC));
      for (DType compute : {DType::f32, DType::bf16}) {
        for (DType out_type : {DType::f32, DType::bf16}) {
          if (compute == DType::f32 && out_type == DType::bf16) continue;
          SCOPED_TRACE(::testing::Message() << weight_quant_name(format) << " " << d.R << "x"
                                            << d.OC << "->" << d.IC << " "
                                            << dtype_name(compute) << " -> " << dtype_name(out_type)
                                            << (matmul_widens(compute) ? " (widened)" : ""));
          std::vector<double> g;
          Tensor dout = input(pool, {d.R, d.OC}, compute, 9, g);
          Tensor dinp = test::make_tensor(pool, {d.R, d.IC}, out_type);
          Tensor ws = scratch_for(pool, d.R, d.IC, d.OC, compute);
          quant_matmul_backward_input(dinp, dout, q.w, ws);
          const bool bf16 = compute == DType::bf16;
          std::vector<double> want(static_cast<size_t>(d.R * d.IC)), sums(want.size());
          ref_backward_input(want.data(), g.data(), q.w, d.R, bf16);
          const std::vector<float> w = test::dequantized(q.w, bf16);
          for (int64_t r = 0; r < d.R; ++r)
            for (int64_t i = 0; i < d.IC; ++i) {
              double s = 0.0;
              for (int64_t o = 0; o < d.OC; ++o)
                s += std::fabs(g[r * d.OC + o]) * std::fabs(w[o * d.IC + i]);
              sums[static_cast<size_t>(r * d.IC + i)] = s;
            }
          EXPECT_TRUE(within(output(dinp), want, sums, d.OC, out_type == DType::bf16));
        }
      }
    }
  }
}

TEST(QuantMatmul, LeadingDimensionsFlatten) {
  // inp (2, 3, IC) is 6 rows: the same numbers as (6, IC).
  MemoryPool pool;
  for (const WeightQuant format : kWeightQuants) {
    OwnedQuant q(format, 70, 96);
    q.quantize(pool, 4);
    std::vector<double> x;
    Tensor inp = input(pool, {2, 3, 96}, DType::f32, 2, x);
    Tensor flat = inp.reshape({6, 96});
    Tensor a = test::make_tensor(pool, {2, 3, 70}), b = test::make_tensor(pool, {6, 70});
    Tensor ws = scratch_for(pool, 6, 96, 70, DType::f32);
    quant_matmul_forward(a, inp, q.w, ws);
    quant_matmul_forward(b, flat, q.w, ws);
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]);
  }
}

TEST(QuantMatmul, ScratchIsExactlyEnoughAndChecked) {
  MemoryPool pool;
  const int64_t R = 9, IC = 200, OC = 150;
  for (const WeightQuant format : kWeightQuants) {
    OwnedQuant q(format, OC, IC);
    q.quantize(pool, 6);
    const std::string op = fmt::format("[{}_matmul_forward]", weight_quant_name(format));
    for (DType compute : {DType::f32, DType::bf16}) {
      std::vector<double> x;
      Tensor inp = input(pool, {R, IC}, compute, 1, x);
      Tensor out = test::make_tensor(pool, {R, OC}, compute);
      const auto bytes = static_cast<int64_t>(quant_matmul_scratch_bytes(R, IC, OC, compute));
      // The larger tile (128 rows of 200 here) in the compute type; widened, also the widened
      // input (R x IC f32 for the forward) and an f32 output tile (R x 128). Pool blocks of 64.
      auto block = [](int64_t b) { return (b + 63) / 64 * 64; };
      const int64_t tile = block(128 * IC * static_cast<int64_t>(matmul_widens(compute)
                                                                     ? 4
                                                                     : dtype_size(compute)));
      EXPECT_EQ(bytes,
                matmul_widens(compute) ? block(R * IC * 4) + tile + block(R * 128 * 4) : tile);
      Tensor exact = Tensor::empty(pool, {bytes}, DType::u8, Category::workspace, "ws");
      EXPECT_NO_THROW(quant_matmul_forward(out, inp, q.w, exact));
      Tensor small = Tensor::empty(pool, {bytes - 1}, DType::u8, Category::workspace, "ws");
      EXPECT_TRUE(test::throws_with<ShapeError>(
          [&] { quant_matmul_forward(out, inp, q.w, small); }, {op.c_str(), "too small"}));
    }
  }
}

TEST(QuantMatmul, ScratchIsATileNotAWeight) {
  // A 4096 x 4096 layer at 2048 rows: the tiles are 2 MiB (f32) or 1 MiB (bf16) against the
  // 64 / 32 MiB of a dequantized weight; the widened route adds the 32 MiB f32 input and a 1 MiB
  // output tile, as matmul_widened.h's route would.
  const size_t MiB = size_t{1} << 20;
  EXPECT_EQ(quant_matmul_scratch_bytes(2048, 4096, 4096, DType::f32), 2 * MiB);
  EXPECT_EQ(quant_matmul_scratch_bytes(2048, 4096, 4096, DType::bf16),
            matmul_widens(DType::bf16) ? 35 * MiB : 1 * MiB);
  // 4096 x 11008 (out x in): the forward's 128 rows of 11008 are the larger tile.
  EXPECT_EQ(quant_matmul_scratch_bytes(2048, 11008, 4096, DType::f32), 128u * 11008 * 4);
  EXPECT_THROW(quant_matmul_scratch_bytes(1, 64, 64, DType::f16), DTypeError);
}

TEST(QuantMatmul, RejectsWrongShapesAndTypes) {
  MemoryPool pool;
  OwnedQuant q(WeightQuant::nf4, 64, 128);
  q.quantize(pool, 1);
  Tensor ws = scratch_for(pool, 4, 128, 64, DType::f32);
  std::vector<double> x;
  Tensor inp = input(pool, {4, 100}, DType::f32, 1, x);
  Tensor out = test::make_tensor(pool, {4, 64});
  EXPECT_TRUE(test::throws_with<ShapeError>([&] { quant_matmul_forward(out, inp, q.w, ws); },
                                            {"[nf4_matmul_forward]", "inp", "128"}));
  Tensor inp2 = input(pool, {4, 128}, DType::f32, 1, x);
  Tensor out_bf = test::make_tensor(pool, {4, 64}, DType::bf16);
  EXPECT_THROW(quant_matmul_forward(out_bf, inp2, q.w, ws), DTypeError);  // f32 gives f32
  Tensor dinp = test::make_tensor(pool, {4, 127});
  Tensor dout = input(pool, {4, 64}, DType::f32, 1, x);
  EXPECT_TRUE(test::throws_with<ShapeError>(
      [&] { quant_matmul_backward_input(dinp, dout, q.w, ws); },
      {"[nf4_matmul_backward_input]"}));
  // An int8 weight's errors name its op; an undefined weight is refused.
  OwnedQuant i8(WeightQuant::int8, 64, 128);
  i8.quantize(pool, 2);
  EXPECT_TRUE(test::throws_with<ShapeError>([&] { quant_matmul_forward(out, inp, i8.w, ws); },
                                            {"[int8_matmul_forward]", "inp", "128"}));
  EXPECT_THROW(quant_matmul_forward(out, inp2, QuantWeight{}, ws), Error);
}

}  // namespace
}  // namespace memfit::kernels
