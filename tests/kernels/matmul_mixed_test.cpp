// The linear layer with bf16 operands: forward (f32 or bf16 out, f32 or bf16 bias) and backward
// (f32 or bf16 dinp, f32 dweight and dbias accumulated) against the double reference twice:
// tightly on the bf16-rounded inputs (only f32 accumulation and the final rounding differ) and
// loosely on the unrounded ones (what bf16 costs end to end); then the typed errors. The products
// run as the model runs them on this CPU (routed_forward/backward): oneDNN's bf16 kernels from
// AVX-512 up, the widened f32 route below it, both within the same tolerances.
#include <gtest/gtest.h>

#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/ref/matmul_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

// f32 results of bf16 inputs vs double on the same (rounded) inputs: f32 accumulation only.
constexpr double kAccumTol = 1e-5;
// Norm-wise relative error of bf16 arithmetic vs the double reference on unrounded inputs.
constexpr double kBf16Tol = 1e-2;

struct LinearShape {
  int64_t R, IC, OC;
};
const LinearShape kShapes[] = {{1, 1, 1},    {7, 3, 5},     {5, 17, 33},
                               {31, 24, 65}, {64, 96, 130}, {33, 384, 77}};

// A bf16 tensor from uniform values; `exact` gets the rounded values, `raw` the unrounded.
Tensor bf16_tensor(MemoryPool& pool, Shape shape, uint32_t seed, std::vector<double>* exact,
                   std::vector<double>* raw) {
  *raw = random_values(static_cast<size_t>(shape.numel()), seed);
  Tensor t = make_tensor(pool, shape, DType::bf16);
  copy_in_any(t, *raw);
  *exact = rounded(DType::bf16, *raw);
  return t;
}

TEST(MatmulBf16, ForwardMatchesReference) {
  MemoryPool pool;
  for (const auto& [R, IC, OC] : kShapes) {
    for (DType out_type : {DType::f32, DType::bf16}) {
      for (DType bias_type : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(fmt::format("R={} IC={} OC={} out {} bias {}", R, IC, OC, dtype_name(out_type),
                                 dtype_name(bias_type)));
        std::vector<double> x, x_raw, w, w_raw, b;
        Tensor inp = bf16_tensor(pool, {R, IC}, 1, &x, &x_raw);
        Tensor weight = bf16_tensor(pool, {OC, IC}, 2, &w, &w_raw);
        Tensor bias = random_any(pool, {OC}, bias_type, 3, &b);
        Tensor out = random_any(pool, {R, OC}, out_type, 4);  // overwritten
        routed_forward(pool, out, inp, weight, bias);
        std::vector<double> want(R * OC), want_raw(R * OC);
        ref::matmul_forward(want.data(), x.data(), w.data(), b.data(), R, IC, OC);
        ref::matmul_forward(want_raw.data(), x_raw.data(), w_raw.data(), b.data(), R, IC, OC);
        const std::vector<double> got = to_doubles_any(out);
        if (out_type == DType::f32) {
          EXPECT_LT(rel_error(got, want), kAccumTol);
        } else {  // one rounding to bf16 on top of f32 accumulation
          EXPECT_TRUE(all_close(got, want, unit_roundoff(DType::bf16), kAccumTol * max_abs(want)));
        }
        EXPECT_LT(rel_error(got, want_raw), kBf16Tol);
      }
    }
  }
}

TEST(MatmulBf16, BackwardMatchesReference) {
  MemoryPool pool;
  for (const auto& [R, IC, OC] : kShapes) {
    for (DType dinp_type : {DType::f32, DType::bf16}) {
      for (bool optional : {false, true}) {
        SCOPED_TRACE(fmt::format("R={} IC={} OC={} dinp {} dinp/dbias={}", R, IC, OC,
                                 dtype_name(dinp_type), optional));
        std::vector<double> x, x_raw, w, w_raw, g, g_raw, dw0, db0;
        Tensor inp = bf16_tensor(pool, {R, IC}, 1, &x, &x_raw);
        Tensor weight = bf16_tensor(pool, {OC, IC}, 2, &w, &w_raw);
        Tensor dout = bf16_tensor(pool, {R, OC}, 3, &g, &g_raw);
        // dweight and dbias accumulate onto what they hold; dinp is overwritten.
        Tensor dweight = random_tensor(pool, {OC, IC}, 4, &dw0);
        Tensor dbias = optional ? random_tensor(pool, {OC}, 5, &db0) : Tensor();
        Tensor dinp = optional ? random_any(pool, {R, IC}, dinp_type, 6) : Tensor();
        routed_backward(pool, dinp, dweight, dbias, dout, inp, weight);

        std::vector<double> want_dinp(R * IC), want_dw = dw0, want_db = db0;
        ref::matmul_backward(want_dinp.data(), want_dw.data(), optional ? want_db.data() : nullptr,
                             g.data(), x.data(), w.data(), R, IC, OC);
        std::vector<double> raw_dinp(R * IC), raw_dw = dw0, raw_db = db0;
        ref::matmul_backward(raw_dinp.data(), raw_dw.data(), optional ? raw_db.data() : nullptr,
                             g_raw.data(), x_raw.data(), w_raw.data(), R, IC, OC);
        EXPECT_LT(rel_error(to_doubles(dweight), want_dw), kAccumTol) << "dweight";
        // Against the unrounded reference, the increment (dweight - dw0) is what bf16 touches;
        // the accumulated sum may cancel to near zero in the tiny shapes.
        std::vector<double> inc = to_doubles(dweight);
        for (size_t i = 0; i < inc.size(); ++i) {
          inc[i] -= dw0[i];
          raw_dw[i] -= dw0[i];
        }
        EXPECT_LT(rel_error(inc, raw_dw), kBf16Tol) << "dweight";
        if (!optional) continue;
        EXPECT_LT(rel_error(to_doubles(dbias), want_db), kAccumTol) << "dbias";
        const std::vector<double> got = to_doubles_any(dinp);
        if (dinp_type == DType::f32) {
          EXPECT_LT(rel_error(got, want_dinp), kAccumTol) << "dinp";
        } else {
          EXPECT_TRUE(
              all_close(got, want_dinp, unit_roundoff(DType::bf16), kAccumTol * max_abs(want_dinp)))
              << "dinp";
        }
        EXPECT_LT(rel_error(got, raw_dinp), kBf16Tol) << "dinp";
      }
    }
  }
}

// K = 0 (no input features): the output is the bias, rounded to the output's type.
TEST(MatmulBf16, EmptyInnerDimensionGivesTheBias) {
  MemoryPool pool;
  Tensor inp = make_tensor(pool, {3, 0}, DType::bf16), w = make_tensor(pool, {5, 0}, DType::bf16);
  std::vector<double> b;
  Tensor bias = random_any(pool, {5}, DType::bf16, 1, &b);
  Tensor out = random_any(pool, {3, 5}, DType::bf16, 2);
  routed_forward(pool, out, inp, w, bias);
  const std::vector<double> got = to_doubles_any(out);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(got[r * 5 + c], b[c]);
}

TEST(MatmulBf16, RunsOnOneDnnsBf16Kernels) {
  if (!dnnl_gemm::bf16_native())
    GTEST_SKIP() << "oneDNN has no native bf16 matmul below AVX512_BF16 (its ISA here: " << dnnl_gemm::isa()
                 << "); bf16 takes the widened route, tested in matmul_widened_test";
  dnnl_gemm::GemmSpec s;
  s.M = s.N = s.K = 64;
  s.lda = s.ldb = s.ldc = 64;
  s.a_type = s.b_type = DType::bf16;
  const std::string impl = dnnl_gemm::implementation(s);
  RecordProperty("bf16_impl", impl);  // brg:avx512_core_amx_bf16 on Sapphire Rapids
  EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
}

// Note [GEMM kernel]: a bf16 product keeps oneDNN's first choice, whether B is read transposed or
// not, unless it is a weight gradient (A read transposed) and that choice is not an AMX kernel:
// then it takes the GEMM-based kernel (the f32 products always do). The weight gradients'
// values against the reference are checked by BackwardMatchesReference, on this route.
TEST(MatmulBf16, WeightGradientsTakeTheGemmKernelUnlessAmx) {
  if (!dnnl_gemm::bf16_native())
    GTEST_SKIP() << "oneDNN has no native bf16 matmul below AVX512_BF16 (its ISA here: " << dnnl_gemm::isa()
                 << "); bf16 takes the widened route, tested in matmul_widened_test";
  using Kernel = dnnl_gemm::GemmSpec::Kernel;
  int weight_gradients = 0;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      dnnl_gemm::GemmSpec s;
      s.M = 64, s.N = 96, s.K = 384, s.trans_a = trans_a, s.trans_b = trans_b;
      s.lda = trans_a ? 64 : 384, s.ldb = trans_b ? 384 : 96, s.ldc = 96;
      s.beta = trans_a ? 1.0f : 0.0f;  // a weight gradient accumulates
      s.a_type = s.b_type = DType::bf16;
      dnnl_gemm::GemmSpec first = s;
      first.kernel = Kernel::first;
      const std::string impl = dnnl_gemm::implementation(s);
      const std::string first_impl = dnnl_gemm::implementation(first);
      SCOPED_TRACE(fmt::format("trans_a {} trans_b {}: {} (first choice {})", trans_a, trans_b,
                               impl, first_impl));
      EXPECT_EQ(impl.find("ref"), std::string::npos);
      if (trans_a && first_impl.find("amx") == std::string::npos) {
        EXPECT_EQ(impl.rfind("gemm:", 0), 0u);
        ++weight_gradients;
      } else {
        EXPECT_EQ(impl, first_impl);
      }
    }
  }
  RecordProperty("bf16_weight_gradients_in_gemm_kernel", weight_gradients);
}

TEST(MatmulBf16, DTypeErrors) {
  MemoryPool pool;
  Tensor x = make_tensor(pool, {4, 8}, DType::bf16), w = make_tensor(pool, {6, 8}, DType::bf16);
  Tensor out = make_tensor(pool, {4, 6}), none;
  Tensor x16 = make_tensor(pool, {4, 8}, DType::f16), w16 = make_tensor(pool, {6, 8}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_forward(out, x16, w16, none); },
                                      {"[matmul]", "inp", "f16", "oneDNN 2.6"}));
  Tensor w32 = make_tensor(pool, {6, 8});
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_forward(out, x, w32, none); },
                                      {"[matmul]", "weight", "bf16", "f32"}));
  Tensor out16 = make_tensor(pool, {4, 6}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_forward(out16, x, w, none); },
                                      {"[matmul]", "out", "f32 or bf16", "f16"}));
  Tensor x32 = make_tensor(pool, {4, 8}), out_bf = make_tensor(pool, {4, 6}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_forward(out_bf, x32, w32, none); },
                                      {"[matmul]", "out", "f32", "bf16"}));

  Tensor dw = make_tensor(pool, {6, 8}), dout32 = make_tensor(pool, {4, 6});
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_backward(none, dw, none, dout32, x, w); },
                                      {"[matmul]", "dout", "bf16", "f32", "convert"}));
  Tensor dout = make_tensor(pool, {4, 6}, DType::bf16),
         dw_bf = make_tensor(pool, {6, 8}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_backward(none, dw_bf, none, dout, x, w); },
                                      {"[matmul]", "dweight", "f32", "bf16"}));
  Tensor dinp16 = make_tensor(pool, {4, 8}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_backward(dinp16, dw, none, dout, x, w); },
                                      {"[matmul]", "dinp", "f16"}));
  Tensor db_bf = make_tensor(pool, {6}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_backward(none, dw, db_bf, dout, x, w); },
                                      {"[matmul]", "dbias", "f32", "bf16"}));
}

// Where oneDNN cannot multiply bf16, matmul_forward/backward say so and name the route to take,
// instead of failing inside oneDNN.
TEST(MatmulBf16, WithoutOneDnnBf16TheErrorNamesTheWidenedRoute) {
  if (dnnl_gemm::bf16_native())
    GTEST_SKIP() << "oneDNN multiplies bf16 here (" << dnnl_gemm::isa()
                 << "); CI's MEMFIT_MAX_ISA=avx2 run covers this";
  MemoryPool pool;
  Tensor x = make_tensor(pool, {4, 8}, DType::bf16), w = make_tensor(pool, {6, 8}, DType::bf16);
  Tensor out = make_tensor(pool, {4, 6}), none;
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_forward(out, x, w, none); },
                                      {"[matmul]", "bf16", "AVX512_BF16", "matmul_widened"}));
  Tensor dw = make_tensor(pool, {6, 8}), dout = make_tensor(pool, {4, 6}, DType::bf16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { matmul_backward(none, dw, none, dout, x, w); },
                                      {"[matmul]", "bf16", "matmul_widened"}));
}

}  // namespace
}  // namespace memfit::kernels
