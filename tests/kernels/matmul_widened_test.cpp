// Widened half-precision matmuls (kernels/cpu/matmul_widened.h: fp16 everywhere, bf16 where
// oneDNN has no bf16 matmul) against the FP32 kernels run on the widened operands: the route is
// "widen exactly, run the f32 GEMM, round once", so f32 results must be the f32 kernel's bit for
// bit and half results its round-to-nearest-even, for f16 and for bf16, every mix of half and
// f32 operands, odd shapes, optional dinp and dbias, and a scratch of exactly the size
// matmul_widened_scratch_bytes promises. Then the typed errors, and which types take the route.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "memfit/kernels/cpu/matmul.h"
#include "memfit/core/cpu.h"
#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

struct LinearShape {
  int64_t R, IC, OC;
};
const LinearShape kShapes[] = {{1, 1, 1}, {7, 3, 5}, {5, 17, 33}, {31, 24, 65}, {33, 96, 77}};

// The f32 scratch the kernels are given: exactly what matmul_widened_scratch_bytes asks for.
Tensor scratch_for(MemoryPool& pool, int64_t R, int64_t IC, int64_t OC) {
  const size_t bytes = matmul_widened_scratch_bytes(R, IC, OC);
  return make_tensor(pool, {static_cast<int64_t>((bytes + 3) / 4)});
}

// An f32 copy of t's values (exact: every f16 is a float).
Tensor widened(MemoryPool& pool, const Tensor& t) {
  if (!t.defined()) return t;
  Tensor w = make_tensor(pool, t.shape());
  copy_in(w, to_doubles_any(t));
  return w;
}

// got (f32, f16 or bf16) must be want (f32) bit for bit, or its RNE to the half type. Names
// the first difference.
::testing::AssertionResult is_exactly(const Tensor& got, const Tensor& want) {
  const float* w = want.data<float>();
  for (int64_t i = 0; i < want.numel(); ++i) {
    bool same;
    double value;
    if (got.dtype() == DType::f32) {
      const float g = got.data<float>()[i];
      same = std::memcmp(&g, &w[i], 4) == 0;
      value = g;
    } else {
      const uint16_t g = static_cast<const uint16_t*>(got.raw_data())[i];
      const bool bf = got.dtype() == DType::bf16;
      same = g == (bf ? bf16_from_f32(w[i]) : f16_from_f32(w[i]));
      value = bf ? f32_from_bf16(g) : f32_from_f16(g);
    }
    if (!same)
      return ::testing::AssertionFailure()
             << "element " << i << " of " << want.numel() << ": got " << value << ", want "
             << w[i]
             << (got.dtype() == DType::f32 ? " (f32, bit for bit)" : " rounded to half");
  }
  return ::testing::AssertionSuccess();
}

const DType kHalfTypes[] = {DType::f16, DType::bf16};

TEST(MatmulWidened, ForwardIsTheF32KernelOnWidenedOperands) {
  MemoryPool pool;
  for (DType half : kHalfTypes) {
  const DType kOperandTypes[] = {half, DType::f32};
  for (const auto& [R, IC, OC] : kShapes) {
    for (DType xt : kOperandTypes) {
      for (DType wt : kOperandTypes) {
        for (std::optional<DType> bt : {std::optional<DType>{}, std::optional{half},
                                        std::optional{DType::f32}}) {
          for (DType ot : kOperandTypes) {
            SCOPED_TRACE(fmt::format("R={} IC={} OC={} inp {} weight {} bias {} out {}", R, IC, OC,
                                     dtype_name(xt), dtype_name(wt),
                                     bt ? dtype_name(*bt) : "none", dtype_name(ot)));
            Tensor inp = random_any(pool, {R, IC}, xt, 1);
            Tensor weight = random_any(pool, {OC, IC}, wt, 2);
            Tensor bias = bt ? random_any(pool, {OC}, *bt, 3) : Tensor();
            Tensor out = random_any(pool, {R, OC}, ot, 4);  // overwritten
            Tensor scratch = scratch_for(pool, R, IC, OC);
            matmul_forward_widened(out, inp, weight, bias, scratch);

            Tensor x = widened(pool, inp), w = widened(pool, weight), b = widened(pool, bias);
            Tensor want = make_tensor(pool, {R, OC});
            matmul_forward(want, x, w, b);
            EXPECT_TRUE(is_exactly(out, want));
          }
        }
      }
    }
  }
  }
}

TEST(MatmulWidened, BackwardIsTheF32KernelOnWidenedOperands) {
  MemoryPool pool;
  for (DType half : kHalfTypes) {
  const DType kOperandTypes[] = {half, DType::f32};
  for (const auto& [R, IC, OC] : kShapes) {
    for (DType gt : kOperandTypes) {
      for (DType xt : kOperandTypes) {
        for (DType wt : kOperandTypes) {
          for (std::optional<DType> dxt : {std::optional<DType>{}, std::optional{half},
                                           std::optional{DType::f32}}) {
            for (bool with_dbias : {false, true}) {
              SCOPED_TRACE(fmt::format("R={} IC={} OC={} dout {} inp {} weight {} dinp {} dbias {}",
                                       R, IC, OC, dtype_name(gt), dtype_name(xt), dtype_name(wt),
                                       dxt ? dtype_name(*dxt) : "none", with_dbias));
              Tensor dout = random_any(pool, {R, OC}, gt, 1);
              Tensor inp = random_any(pool, {R, IC}, xt, 2);
              Tensor weight = random_any(pool, {OC, IC}, wt, 3);
              // dweight and dbias accumulate onto what they hold; dinp is overwritten.
              Tensor dweight = random_any(pool, {OC, IC}, DType::f32, 4);
              Tensor dbias = with_dbias ? random_any(pool, {OC}, DType::f32, 5) : Tensor();
              Tensor dinp = dxt ? random_any(pool, {R, IC}, *dxt, 6) : Tensor();
              Tensor want_dw = widened(pool, dweight), want_db = widened(pool, dbias);
              Tensor want_dx = dxt ? make_tensor(pool, {R, IC}) : Tensor();
              Tensor scratch = scratch_for(pool, R, IC, OC);
              matmul_backward_widened(dinp, dweight, dbias, dout, inp, weight, scratch);

              Tensor g = widened(pool, dout), x = widened(pool, inp), w = widened(pool, weight);
              matmul_backward(want_dx, want_dw, want_db, g, x, w);
              EXPECT_TRUE(is_exactly(dweight, want_dw)) << "dweight";
              if (with_dbias) {
                EXPECT_TRUE(is_exactly(dbias, want_db)) << "dbias";
              }
              if (dxt) {
                EXPECT_TRUE(is_exactly(dinp, want_dx)) << "dinp";
              }
            }
          }
        }
      }
    }
  }
  }
}

// The two halves around a rewrite of inp (the GPT-2 MLP recomputes its GELU there): dinp from
// dout and the weight before between() runs, dweight and dbias from the rewritten inp, each bit
// for bit the one-call route's on those operands; between() runs once and sees dinp final.
TEST(MatmulWidened, BackwardAroundARewriteOfInpIsTheOneCallRouteOnEachHalf) {
  MemoryPool pool;
  for (DType half : kHalfTypes) {
    for (const auto& [R, IC, OC] : kShapes) {
      SCOPED_TRACE(fmt::format("{} R={} IC={} OC={}", dtype_name(half), R, IC, OC));
      Tensor dout = random_any(pool, {R, OC}, half, 1);
      Tensor inp = random_any(pool, {R, IC}, half, 2);
      Tensor weight = random_any(pool, {OC, IC}, half, 3);
      Tensor later = random_any(pool, {R, IC}, half, 7);  // what between() writes into inp
      Tensor dweight = random_any(pool, {OC, IC}, DType::f32, 4);
      Tensor dbias = random_any(pool, {OC}, DType::f32, 5);
      Tensor dinp = random_any(pool, {R, IC}, half, 6);
      Tensor want_dw = widened(pool, dweight), want_db = widened(pool, dbias);
      Tensor want_dx = make_tensor(pool, {R, IC}), none;
      Tensor g = widened(pool, dout), w = widened(pool, weight);
      matmul_backward(want_dx, none, none, g, widened(pool, inp), w);
      matmul_backward(none, want_dw, want_db, g, widened(pool, later), w);

      Tensor scratch = scratch_for(pool, R, IC, OC);
      int calls = 0;
      matmul_backward_widened_around(dinp, dweight, dbias, dout, inp, weight, scratch, [&] {
        ++calls;
        EXPECT_TRUE(is_exactly(dinp, want_dx)) << "dinp, when between() runs";
        std::memcpy(inp.raw_data(), later.raw_data(), inp.nbytes());
      });
      EXPECT_EQ(calls, 1);
      EXPECT_TRUE(is_exactly(dinp, want_dx)) << "dinp";
      EXPECT_TRUE(is_exactly(dweight, want_dw)) << "dweight";
      EXPECT_TRUE(is_exactly(dbias, want_db)) << "dbias";
    }
  }
}

TEST(MatmulWidened, AnF16ResultOverflowsToInfinityAsRoundingSays) {
  // Sums of 8 products of 100..200 by 100..200 (80000 and up) lie past f16's range: the f32
  // result is finite, the f16 one infinite (65520 and up round to it).
  MemoryPool pool;
  Tensor inp = random_any(pool, {3, 8}, DType::f16, 1, nullptr, 100.0, 200.0);
  Tensor weight = random_any(pool, {2, 8}, DType::f16, 2, nullptr, 100.0, 200.0);
  Tensor out = make_tensor(pool, {3, 2}, DType::f16), scratch = scratch_for(pool, 3, 8, 2);
  Tensor no_bias;
  matmul_forward_widened(out, inp, weight, no_bias, scratch);
  for (double v : to_doubles_any(out)) EXPECT_TRUE(std::isinf(v) && v > 0) << v;
}

TEST(MatmulWidened, TooSmallAScratchIsAShapeErrorAndMixedHalvesAreDTypeErrors) {
  MemoryPool pool;
  const int64_t R = 5, IC = 17, OC = 33;
  Tensor inp = random_any(pool, {R, IC}, DType::f16, 1);
  Tensor weight = random_any(pool, {OC, IC}, DType::f16, 2);
  Tensor bias = random_any(pool, {OC}, DType::f16, 3);
  Tensor out = make_tensor(pool, {R, OC}, DType::f16);
  Tensor dout = random_any(pool, {R, OC}, DType::f16, 4);
  Tensor dinp = make_tensor(pool, {R, IC}, DType::f16);
  Tensor dweight = make_tensor(pool, {OC, IC}), dbias = make_tensor(pool, {OC});
  const int64_t enough = scratch_for(pool, R, IC, OC).numel();
  // A scratch that holds the widened input but not the weight.
  Tensor small = make_tensor(pool, {R * IC + 8});
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] { matmul_forward_widened(out, inp, weight, bias, small); }, {"[matmul_widened]", "weight"}));
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] { matmul_backward_widened(dinp, dweight, dbias, dout, inp, weight, small); },
      {"[matmul_widened]", "scratch"}));

  Tensor scratch = make_tensor(pool, {enough});
  Tensor bf16_inp = random_any(pool, {R, IC}, DType::bf16, 5);
  Tensor bf16_weight = random_any(pool, {OC, IC}, DType::bf16, 6);
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { matmul_forward_widened(out, bf16_inp, weight, bias, scratch); }, {"inp", "bf16"}));
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { matmul_forward_widened(out, inp, bf16_weight, bias, scratch); }, {"weight", "bf16"}));
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { matmul_backward_widened(dinp, dweight, dbias, dout, bf16_inp, weight, scratch); },
      {"inp", "bf16"}));
  Tensor bf16_out = make_tensor(pool, {R, OC}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { matmul_forward_widened(bf16_out, inp, weight, bias, scratch); }, {"out", "bf16"}));
  Tensor i8_inp = make_tensor(pool, {R, IC}, DType::i8);
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { matmul_forward_widened(out, i8_inp, weight, bias, scratch); }, {"inp", "f32, bf16 or f16"}));
  Tensor bf16_scratch = make_tensor(pool, {2 * enough}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { matmul_forward_widened(out, inp, weight, bias, bf16_scratch); }, {"scratch"}));
}

TEST(MatmulWidened, F32OperandsNeedNoScratch) {
  // Everything f32: the operands are used in place, so a one-float scratch is enough and the
  // result is the f32 kernel's.
  MemoryPool pool;
  Tensor inp = random_any(pool, {7, 3}, DType::f32, 1);
  Tensor weight = random_any(pool, {5, 3}, DType::f32, 2);
  Tensor bias = random_any(pool, {5}, DType::f32, 3);
  Tensor out = make_tensor(pool, {7, 5}), want = make_tensor(pool, {7, 5});
  Tensor tiny = make_tensor(pool, {1});
  matmul_forward_widened(out, inp, weight, bias, tiny);
  matmul_forward(want, inp, weight, bias);
  EXPECT_TRUE(is_exactly(out, want));
}

// f16 always widens, f32 never, bf16 exactly where oneDNN has no native bf16 matmul: AVX2-only
// CPUs (or MEMFIT_MAX_ISA=avx2, CI's second run) and plain AVX-512 (Cascade Lake, or
// MEMFIT_MAX_ISA=avx512), where its bf16 matmul is emulated; from AVX512_BF16 up oneDNN
// multiplies bf16 (a primitive is built there).
TEST(MatmulWidened, WhichTypesTakeTheRoute) {
  EXPECT_TRUE(matmul_widens(DType::f16));
  EXPECT_FALSE(matmul_widens(DType::f32));
  EXPECT_EQ(matmul_widens(DType::bf16), !dnnl_gemm::bf16_native());
  EXPECT_EQ(dnnl_gemm::bf16_native(), cpu::has(cpu::Isa::avx512_bf16))
      << "oneDNN ISA " << dnnl_gemm::isa() << ", memfit max ISA " << cpu::isa_name(cpu::max_isa());
}

// The blocked route (the LM head's: matmul_*_widened_blocked) against a double-precision
// reference of the half operands' values, over a weight of more rows than one block
// (kWidenedWeightRows) so that the blocks, the last one partial, and dinp's sum over blocks are
// exercised, with exactly the scratch matmul_widened_blocked_scratch_bytes promises. Not bit for
// bit against the one-GEMM route: dinp adds the blocks' partial products in block order.
// Tolerance: f32 accumulation over K terms of size <= 1, so K * 2^-24 * (sum of |terms|).
struct BlockedCase {
  int64_t R, IC, OC;
};
const BlockedCase kBlockedCases[] = {{3, 8, 5}, {5, 24, 2 * kWidenedWeightRows + 37},
                                     {2, 16, kWidenedWeightRows}};

// want[r][o] = sum_i x[r][i] w[o][i] (and |terms| summed), in double.
struct Product {
  std::vector<double> value, magnitude;
};
Product product(const std::vector<double>& a, const std::vector<double>& b, int64_t M,
                int64_t N, int64_t K, bool a_t, bool b_t) {
  Product p{std::vector<double>(M * N), std::vector<double>(M * N)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const double t = (a_t ? a[k * M + m] : a[m * K + k]) * (b_t ? b[n * K + k] : b[k * N + n]);
        p.value[m * N + n] += t;
        p.magnitude[m * N + n] += std::abs(t);
      }
  return p;
}

::testing::AssertionResult within_accumulation(const Tensor& got, const Product& want, int64_t K,
                                               const std::vector<double>& base = {}) {
  const std::vector<double> g = to_doubles_any(got);
  for (size_t i = 0; i < g.size(); ++i) {
    const double w = want.value[i] + (base.empty() ? 0.0 : base[i]);
    const double allowed = (K + 2) * 0x1p-24 * (want.magnitude[i] + std::abs(w)) + 1e-30;
    if (!(std::abs(g[i] - w) <= allowed))
      return ::testing::AssertionFailure() << "element " << i << " of " << g.size() << ": got "
                                           << g[i] << ", want " << w << " within " << allowed;
  }
  return ::testing::AssertionSuccess();
}

TEST(MatmulWidened, BlockedForwardAndBackwardMatchTheReferenceOverSeveralBlocks) {
  MemoryPool pool;
  for (DType half : {DType::bf16, DType::f16, DType::f32}) {
    for (const auto& [R, IC, OC] : kBlockedCases) {
      SCOPED_TRACE(fmt::format("{} R={} IC={} OC={}", dtype_name(half), R, IC, OC));
      Tensor inp = random_any(pool, {R, IC}, half, 1);
      Tensor weight = random_any(pool, {OC, IC}, half, 2);
      const size_t bytes = matmul_widened_blocked_scratch_bytes(R, IC, OC);
      Tensor scratch = make_tensor(pool, {static_cast<int64_t>(bytes / 4)});
      const std::vector<double> x = to_doubles_any(inp), w = to_doubles_any(weight);

      Tensor out = random_any(pool, {R, OC}, DType::f32, 3);  // overwritten
      matmul_forward_widened_blocked(out, inp, weight, scratch);
      EXPECT_TRUE(within_accumulation(out, product(x, w, R, OC, IC, false, true), IC)) << "out";

      Tensor dout = random_any(pool, {R, OC}, DType::f32, 4);
      Tensor dinp = random_any(pool, {R, IC}, DType::f32, 5);  // overwritten
      Tensor dweight = random_any(pool, {OC, IC}, DType::f32, 6);  // accumulated onto
      const std::vector<double> g = to_doubles_any(dout), dw0 = to_doubles_any(dweight);
      matmul_backward_widened_blocked(dinp, dweight, dout, inp, weight, scratch);
      EXPECT_TRUE(within_accumulation(dinp, product(g, w, R, IC, OC, false, false), OC))
          << "dinp";
      EXPECT_TRUE(within_accumulation(dweight, product(g, x, OC, IC, R, true, false), R, dw0))
          << "dweight";
    }
  }
}

TEST(MatmulWidened, BlockedScratchHoldsTheInputAndOneBlockAndLessIsAShapeError) {
  // The scratch is the widened input plus one block of widened weight rows, however tall the
  // weight: that is the route's point (the LM head's (Vp, C) weight is never widened whole).
  const int64_t R = 4, IC = 32;
  const size_t one_block = matmul_widened_blocked_scratch_bytes(R, IC, kWidenedWeightRows);
  EXPECT_EQ(matmul_widened_blocked_scratch_bytes(R, IC, 50304), one_block);
  EXPECT_LT(matmul_widened_blocked_scratch_bytes(R, IC, 7), one_block);
  MemoryPool pool;
  Tensor inp = random_any(pool, {R, IC}, DType::bf16, 1);
  Tensor weight = random_any(pool, {3000, IC}, DType::bf16, 2);
  Tensor out = make_tensor(pool, {R, 3000});
  Tensor small = make_tensor(pool, {static_cast<int64_t>(one_block / 4) - 1});
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] { matmul_forward_widened_blocked(out, inp, weight, small); },
      {"matmul_forward_widened_blocked", "scratch"}));
  Tensor f16_weight = random_any(pool, {3000, IC}, DType::f16, 3);
  Tensor scratch = make_tensor(pool, {static_cast<int64_t>(one_block / 4)});
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { matmul_forward_widened_blocked(out, inp, f16_weight, scratch); }, {"share a type"}));
}

}  // namespace
}  // namespace memfit::kernels
