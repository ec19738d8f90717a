// Tests of the linear layer and GEMM: oneDNN results against the double-precision reference over
// odd and GPT-2-like shapes, the reference's gradients against finite differences, gemm's
// transposes, leading dimensions and beta = 1, and the typed errors on bad arguments.
#include "memfit/kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "matmul_test_util.h"
#include "mixed_test_util.h"
#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/ref/matmul_ref.h"

namespace memfit::kernels {
namespace {

using matmul_test::random_doubles;
using matmul_test::random_tensor;
using matmul_test::rel_error;
using matmul_test::to_double;

// f32 against double over sums of a few hundred products of values in [-1, 1].
constexpr double kTol = 2e-6;

struct LinearShape {
  int64_t R, IC, OC;
};
const LinearShape kShapes[] = {{1, 1, 1},   {1, 3, 7},     {7, 3, 1},    {5, 17, 33},
                               {31, 24, 65}, {64, 96, 130}, {33, 384, 77}, {128, 768, 64}};

TEST(Matmul, ForwardMatchesReference) {
  MemoryPool pool;
  for (const auto& [R, IC, OC] : kShapes) {
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(fmt::format("R={} IC={} OC={} bias={}", R, IC, OC, with_bias));
      Tensor inp = random_tensor(pool, {R, IC}, 1);
      Tensor w = random_tensor(pool, {OC, IC}, 2);
      Tensor bias = with_bias ? random_tensor(pool, {OC}, 3) : Tensor();
      Tensor out = random_tensor(pool, {R, OC}, 4);  // garbage: forward overwrites
      matmul_forward(out, inp, w, bias);
      std::vector<double> want(R * OC), b = with_bias ? to_double(bias) : std::vector<double>();
      ref::matmul_forward(want.data(), to_double(inp).data(), to_double(w).data(),
                          with_bias ? b.data() : nullptr, R, IC, OC);
      EXPECT_LT(rel_error(out, want), kTol);
    }
  }
}

TEST(Matmul, ForwardTakesThreeDimensionalInput) {
  MemoryPool pool;
  const int64_t B = 2, T = 5, IC = 24, OC = 40;
  Tensor inp = random_tensor(pool, {B, T, IC}, 1);
  Tensor w = random_tensor(pool, {OC, IC}, 2);
  Tensor bias = random_tensor(pool, {OC}, 3);
  Tensor out = Tensor::empty(pool, {B, T, OC}, DType::f32, Category::activations, "out");
  matmul_forward(out, inp, w, bias);
  std::vector<double> want(B * T * OC);
  ref::matmul_forward(want.data(), to_double(inp).data(), to_double(w).data(),
                      to_double(bias).data(), B * T, IC, OC);
  EXPECT_LT(rel_error(out, want), kTol);
}

TEST(Matmul, BackwardMatchesReference) {
  MemoryPool pool;
  for (const auto& [R, IC, OC] : kShapes) {
    for (bool optional : {false, true}) {
      SCOPED_TRACE(fmt::format("R={} IC={} OC={} dinp/dbias={}", R, IC, OC, optional));
      Tensor inp = random_tensor(pool, {R, IC}, 1);
      Tensor w = random_tensor(pool, {OC, IC}, 2);
      Tensor dout = random_tensor(pool, {R, OC}, 3);
      // dweight and dbias accumulate onto what they hold; dinp is overwritten.
      Tensor dweight = random_tensor(pool, {OC, IC}, 4);
      Tensor dbias = optional ? random_tensor(pool, {OC}, 5) : Tensor();
      Tensor dinp = optional ? random_tensor(pool, {R, IC}, 6) : Tensor();
      std::vector<double> want_dw = to_double(dweight);
      std::vector<double> want_db = optional ? to_double(dbias) : std::vector<double>();
      std::vector<double> want_dinp(R * IC);
      matmul_backward(dinp, dweight, dbias, dout, inp, w);
      ref::matmul_backward(optional ? want_dinp.data() : nullptr, want_dw.data(),
                           optional ? want_db.data() : nullptr, to_double(dout).data(),
                           to_double(inp).data(), to_double(w).data(), R, IC, OC);
      EXPECT_LT(rel_error(dweight, want_dw), kTol);
      if (optional) {
        EXPECT_LT(rel_error(dinp, want_dinp), kTol);
        EXPECT_LT(rel_error(dbias, want_db), kTol);
      }
    }
  }
}

TEST(Matmul, BackwardWithoutDweightComputesDinpAlone) {
  // The LM head's d(norm) runs alone (its d(head) waits for a group of chunks): dweight
  // undefined is skipped, and dinp is what the full backward gives, in f32 and in bf16.
  MemoryPool pool;
  for (DType dt : {DType::f32, DType::bf16}) {
    if (dt == DType::bf16 && !dnnl_gemm::bf16_native()) continue;  // widened route: its own
    SCOPED_TRACE(dtype_name(dt));
    const int64_t R = 33, IC = 96, OC = 130;
    Tensor inp = test::random_any(pool, {R, IC}, dt, 1);
    Tensor w = test::random_any(pool, {OC, IC}, dt, 2);
    Tensor dout = test::random_any(pool, {R, OC}, dt, 3);
    Tensor dweight = random_tensor(pool, {OC, IC}, 4), none;
    Tensor both = random_tensor(pool, {R, IC}, 6), alone = random_tensor(pool, {R, IC}, 7);
    matmul_backward(both, dweight, none, dout, inp, w);
    matmul_backward(alone, none, none, dout, inp, w);
    EXPECT_TRUE(test::same_bits(both, alone));
  }
}

TEST(Matmul, Bf16ForwardAccumulatesInF32) {
  MemoryPool pool;
  const int64_t R = 19, IC = 40, OC = 33;
  Tensor inp32 = random_tensor(pool, {R, IC}, 1), w32 = random_tensor(pool, {OC, IC}, 2);
  Tensor bias = random_tensor(pool, {OC}, 3);
  Tensor inp = Tensor::empty(pool, {R, IC}, DType::bf16, Category::activations, "inp");
  Tensor w = Tensor::empty(pool, {OC, IC}, DType::bf16, Category::params, "w");
  // The reference sees the bf16-rounded values, so only f32 accumulation error remains.
  auto round = [](const Tensor& src, Tensor& dst) {
    auto* d = static_cast<uint16_t*>(dst.raw_data());
    std::vector<double> r(src.numel());
    for (int64_t i = 0; i < src.numel(); ++i) {
      d[i] = bf16_from_f32(src.data<float>()[i]);
      r[i] = f32_from_bf16(d[i]);
    }
    return r;
  };
  std::vector<double> inp_r = round(inp32, inp), w_r = round(w32, w);
  Tensor out = Tensor::empty(pool, {R, OC}, DType::f32, Category::activations, "out");
  kernels::test::routed_forward(pool, out, inp, w, bias);  // widened where oneDNN lacks bf16
  std::vector<double> want(R * OC);
  ref::matmul_forward(want.data(), inp_r.data(), w_r.data(), to_double(bias).data(), R, IC, OC);
  EXPECT_LT(rel_error(out, want), 1e-5);
}

// Finite differences of L = sum(out * g) in double: the reference backward must match them.
TEST(MatmulRef, GradientsMatchFiniteDifferences) {
  const int64_t R = 3, IC = 5, OC = 4;
  std::vector<double> inp = random_doubles(R * IC, 1), w = random_doubles(OC * IC, 2),
                      b = random_doubles(OC, 3), g = random_doubles(R * OC, 4);
  auto loss = [&] {
    std::vector<double> out(R * OC);
    ref::matmul_forward(out.data(), inp.data(), w.data(), b.data(), R, IC, OC);
    double l = 0.0;
    for (int64_t i = 0; i < R * OC; ++i) l += out[i] * g[i];
    return l;
  };
  std::vector<double> dinp(R * IC), dw(OC * IC, 0.0), db(OC, 0.0);
  ref::matmul_backward(dinp.data(), dw.data(), db.data(), g.data(), inp.data(), w.data(), R, IC,
                       OC);
  const double eps = 1e-6;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double lp = loss();
      x[i] = x0 - eps;
      const double lm = loss();
      x[i] = x0;
      EXPECT_NEAR((lp - lm) / (2 * eps), grad[i], 1e-8) << name << "[" << i << "]";
    }
  };
  check(inp, dinp, "dinp");
  check(w, dw, "dweight");
  check(b, db, "dbias");
}

// gemm on sub-blocks of larger buffers: every transpose combination, alpha, beta = 0 over a C
// holding NaN (must not be read) and beta = 1 (accumulates), with leading dimensions past the
// row lengths.
TEST(Gemm, TransposesLeadingDimsAndBeta) {
  const int64_t M = 13, N = 7, K = 21, pad = 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(fmt::format("trans_a={} trans_b={} beta={}", ta, tb, beta));
        const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
        std::vector<float> A(static_cast<size_t>((ta ? K : M) * lda)),
            B(static_cast<size_t>((tb ? N : K) * ldb)), C(static_cast<size_t>(M * ldc));
        std::vector<double> a = random_doubles(A.size(), 1), b = random_doubles(B.size(), 2),
                            c = random_doubles(C.size(), 3);
        for (size_t i = 0; i < A.size(); ++i) a[i] = A[i] = static_cast<float>(a[i]);
        for (size_t i = 0; i < B.size(); ++i) b[i] = B[i] = static_cast<float>(b[i]);
        for (size_t i = 0; i < C.size(); ++i)
          c[i] = C[i] = (beta == 0.0f && i % ldc < size_t(N)) ? NAN : static_cast<float>(c[i]);
        gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        ref::gemm(ta, tb, M, N, K, 0.5, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        // Padding columns of C are untouched; the rest matches.
        std::vector<double> got(C.begin(), C.end());
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = N; j < ldc; ++j) EXPECT_EQ(got[i * ldc + j], c[i * ldc + j]);
        EXPECT_LT(rel_error(got, c), kTol);
      }
    }
  }
}

TEST(Gemm, DenseOverloadAccumulates) {
  const int64_t M = 4, N = 9, K = 6;
  std::vector<float> A(M * K), B(K * N), C(M * N, 1.0f);
  for (size_t i = 0; i < A.size(); ++i) A[i] = 0.25f * static_cast<float>(i % 5);
  for (size_t i = 0; i < B.size(); ++i) B[i] = 0.5f * static_cast<float>(i % 3) - 0.5f;
  std::vector<double> a(A.begin(), A.end()), b(B.begin(), B.end()), c(C.begin(), C.end());
  gemm(false, false, M, N, K, 1.0f, A.data(), B.data(), 1.0f, C.data());
  gemm(false, false, M, N, K, 1.0f, A.data(), B.data(), 1.0f, C.data());
  ref::gemm(false, false, M, N, K, 1.0, a.data(), K, b.data(), N, 1.0, c.data(), N);
  ref::gemm(false, false, M, N, K, 1.0, a.data(), K, b.data(), N, 1.0, c.data(), N);
  for (int64_t i = 0; i < M * N; ++i) EXPECT_FLOAT_EQ(C[i], static_cast<float>(c[i]));
}

// One head's q and k read straight out of a (T, 3C) qkv buffer: the attention use.
TEST(Gemm, StridedHeadsOfQkv) {
  const int64_t T = 17, C = 24, hs = 8, h = 1;
  std::vector<double> qkv = random_doubles(T * 3 * C, 1);
  std::vector<float> qkv_f(qkv.begin(), qkv.end());
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = qkv_f[i];
  std::vector<float> S(T * T);
  std::vector<double> want(T * T);
  gemm(false, true, T, T, hs, 1.0f, qkv_f.data() + h * hs, 3 * C, qkv_f.data() + C + h * hs,
       3 * C, 0.0f, S.data(), T);
  ref::gemm(false, true, T, T, hs, 1.0, qkv.data() + h * hs, 3 * C, qkv.data() + C + h * hs,
            3 * C, 0.0, want.data(), T);
  EXPECT_LT(rel_error(S.data(), want.data(), T * T), kTol);
}

TEST(Gemm, EmptyProductsAndCaching) {
  std::vector<float> C(6, 2.0f);
  gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 1.0f, C.data());  // K = 0, beta 1: as is
  EXPECT_EQ(C[5], 2.0f);
  gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, C.data());  // K = 0, beta 0: zero
  EXPECT_EQ(C[5], 0.0f);
  gemm(false, false, 0, 3, 4, 1.0f, nullptr, nullptr, 0.0f, nullptr);  // M = 0: nothing to do

  std::vector<float> A(8 * 8, 1.0f), B(8 * 8, 1.0f), D(8 * 8);
  gemm(false, false, 8, 8, 8, 1.0f, A.data(), B.data(), 0.0f, D.data());
  const size_t n = dnnl_gemm::cache_size();
  gemm(false, false, 8, 8, 8, 1.0f, A.data(), B.data(), 0.0f, D.data());
  EXPECT_EQ(dnnl_gemm::cache_size(), n);
  EXPECT_EQ(D[63], 8.0f);
}

// Threads sharing the primitive cache, on shapes some of them build for the first time.
TEST(Gemm, ConcurrentCallersAgree) {
  std::vector<std::thread> threads;
  std::vector<double> errors(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([i, &errors] {
      const int64_t M = 10 + i % 2, N = 23, K = 31;
      std::vector<double> a = random_doubles(M * K, i), b = random_doubles(K * N, i + 10);
      std::vector<float> A(a.begin(), a.end()), B(b.begin(), b.end()), C(M * N);
      for (size_t j = 0; j < a.size(); ++j) a[j] = A[j];
      for (size_t j = 0; j < b.size(); ++j) b[j] = B[j];
      std::vector<double> want(M * N);
      double err = 0.0;
      for (int rep = 0; rep < 20; ++rep) {
        gemm(false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
        ref::gemm(false, false, M, N, K, 1.0, a.data(), K, b.data(), N, 0.0, want.data(), N);
        err = std::max(err, rel_error(C.data(), want.data(), M * N));
      }
      errors[i] = err;
    });
  }
  for (auto& t : threads) t.join();
  for (double e : errors) EXPECT_LT(e, kTol);
}

// The GPT-2 shapes must not land on oneDNN's reference (slow) implementation.
TEST(Gemm, Gpt2ShapesUseOptimizedKernels) {
  dnnl_gemm::GemmSpec fwd;  // out (2048, 1152) = inp (2048, 384) @ weight^T
  fwd.M = 2048, fwd.N = 1152, fwd.K = 384, fwd.trans_b = true;
  fwd.lda = 384, fwd.ldb = 384, fwd.ldc = 1152, fwd.bias = true;
  dnnl_gemm::GemmSpec dw;  // dweight (1152, 384) += dout^T @ inp
  dw.M = 1152, dw.N = 384, dw.K = 2048, dw.trans_a = true;
  dw.lda = 1152, dw.ldb = 384, dw.ldc = 384, dw.beta = 1.0f;
  dnnl_gemm::GemmSpec dinp;  // dinp (2048, 384) = dout @ weight
  dinp.M = 2048, dinp.N = 384, dinp.K = 1152, dinp.lda = 1152, dinp.ldb = 384, dinp.ldc = 384;
  for (const auto& s : {fwd, dw, dinp}) {
    const std::string impl = dnnl_gemm::implementation(s);
    EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
  }
}

// MEMFIT_GEMM_KERNEL takes auto (or nothing), first and jit-weight-gradients; a misspelling is a
// ConfigError that names the variable, not a silent return to the default.
TEST(Gemm, KernelVariableTakesItsThreeRulesAndRefusesOthers) {
  using dnnl_gemm::KernelRule;
  EXPECT_EQ(dnnl_gemm::kernel_rule_from_env(nullptr), KernelRule::automatic);
  EXPECT_EQ(dnnl_gemm::kernel_rule_from_env(""), KernelRule::automatic);
  EXPECT_EQ(dnnl_gemm::kernel_rule_from_env("auto"), KernelRule::automatic);
  EXPECT_EQ(dnnl_gemm::kernel_rule_from_env("first"), KernelRule::first);
  EXPECT_EQ(dnnl_gemm::kernel_rule_from_env("jit-weight-gradients"),
            KernelRule::jit_weight_gradients);
  for (const char* bad : {"frist", "gemm", "jit"}) {
    try {
      dnnl_gemm::kernel_rule_from_env(bad);
      ADD_FAILURE() << "MEMFIT_GEMM_KERNEL=" << bad << " was accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("MEMFIT_GEMM_KERNEL"), std::string::npos) << what;
      EXPECT_NE(what.find(fmt::format("'{}'", bad)), std::string::npos) << what;
    }
  }
}

// Note [GEMM kernel]: every f32 product takes oneDNN's GEMM-based kernel, under any cap
// (below AVX-512 it is oneDNN's first choice anyway), and the spec's kernel is part of the cache
// key: asking for oneDNN's first choice builds a second primitive with the same product.
TEST(Gemm, F32TakesTheGemmKernelAndAgreesWithTheFirstChoice) {
  const int64_t M = 96, N = 3072, K = 80;  // B's rows 12 KiB long, as in the MLP's backward
  dnnl_gemm::GemmSpec s;
  s.M = M, s.N = N, s.K = K, s.lda = K, s.ldb = N, s.ldc = N;
  const std::string impl = dnnl_gemm::implementation(s);
  RecordProperty("f32_impl", impl);
  EXPECT_EQ(impl.rfind("gemm:", 0), 0u) << impl;
  dnnl_gemm::GemmSpec first = s;
  first.kernel = dnnl_gemm::GemmSpec::Kernel::first;
  const size_t before = dnnl_gemm::cache_size();
  EXPECT_EQ(std::string(dnnl_gemm::implementation(first)).find("ref"), std::string::npos);
  EXPECT_EQ(dnnl_gemm::cache_size(), before + 1);

  std::vector<float> A(M * K), B(K * N), C0(M * N), C1(M * N);
  for (size_t i = 0; i < A.size(); ++i) A[i] = float((i * 37) % 101) / 50.0f - 1.0f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = float((i * 53) % 97) / 48.0f - 1.0f;
  dnnl_gemm::execute(s, A.data(), B.data(), C0.data());
  dnnl_gemm::execute(first, A.data(), B.data(), C1.data());
  std::vector<double> a(A.begin(), A.end()), b(B.begin(), B.end()), want(M * N);
  ref::gemm(false, false, M, N, K, 1.0, a.data(), K, b.data(), N, 0.0, want.data(), N);
  EXPECT_LT(rel_error(C0.data(), want.data(), M * N), kTol);
  EXPECT_LT(rel_error(C1.data(), want.data(), M * N), kTol);
}

// ---- errors

template <typename E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return "";
}

TEST(Matmul, InnerDimMismatchIsAShapeErrorWithShapes) {
  MemoryPool pool;
  Tensor inp = random_tensor(pool, {8, 768}, 1), w = random_tensor(pool, {512, 700}, 2);
  Tensor out = Tensor::empty(pool, {8, 512}, DType::f32, Category::activations, "out");
  std::string msg = message_of<ShapeError>([&] { matmul_forward(out, inp, w, Tensor()); });
  EXPECT_NE(msg.find("[matmul] inner dims differ"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(8, 768)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(512, 700)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("matmul.cpp"), std::string::npos) << msg;
}

TEST(Matmul, WrongOutputBiasAndGradShapesAreShapeErrors) {
  MemoryPool pool;
  Tensor inp = random_tensor(pool, {4, 6, 8}, 1), w = random_tensor(pool, {5, 8}, 2);
  Tensor out = Tensor::empty(pool, {24, 5}, DType::f32, Category::activations, "out");
  std::string msg = message_of<ShapeError>([&] { matmul_forward(out, inp, w, Tensor()); });
  EXPECT_NE(msg.find("[matmul] out must be (4, 6, 5), got (24, 5)"), std::string::npos) << msg;
  Tensor good_out = Tensor::empty(pool, {4, 6, 5}, DType::f32, Category::activations, "out");
  Tensor bias = random_tensor(pool, {8}, 3);
  EXPECT_THROW(matmul_forward(good_out, inp, w, bias), ShapeError);

  Tensor dout = random_tensor(pool, {4, 6, 5}, 4), dw = random_tensor(pool, {5, 8}, 5);
  Tensor bad_dinp = random_tensor(pool, {4, 6, 5}, 6), none;
  msg = message_of<ShapeError>([&] { matmul_backward(bad_dinp, dw, none, dout, inp, w); });
  EXPECT_NE(msg.find("dinp must be (4, 6, 8), got (4, 6, 5)"), std::string::npos) << msg;
  Tensor bad_dout = random_tensor(pool, {4, 6, 8}, 7);
  EXPECT_THROW(matmul_backward(none, dw, none, bad_dout, inp, w), ShapeError);
  Tensor bad_dw = random_tensor(pool, {8, 5}, 8);
  EXPECT_THROW(matmul_backward(none, bad_dw, none, dout, inp, w), ShapeError);
  Tensor bad_db = random_tensor(pool, {4}, 9);
  EXPECT_THROW(matmul_backward(none, dw, bad_db, dout, inp, w), ShapeError);
}

TEST(Matmul, WrongDtypesAreDTypeErrors) {
  MemoryPool pool;
  Tensor inp = random_tensor(pool, {4, 8}, 1), w = random_tensor(pool, {5, 8}, 2);
  Tensor out = Tensor::empty(pool, {4, 5}, DType::f32, Category::activations, "out");
  Tensor w16 = Tensor::empty(pool, {5, 8}, DType::bf16, Category::params, "w");
  Tensor ids = Tensor::empty(pool, {4, 8}, DType::i32, Category::activations, "ids");
  Tensor out16 = Tensor::empty(pool, {4, 5}, DType::bf16, Category::activations, "out");
  std::string msg = message_of<DTypeError>([&] { matmul_forward(out, inp, w16, Tensor()); });
  EXPECT_NE(msg.find("[matmul] weight must be f32, got bf16 (5, 8)"), std::string::npos) << msg;
  EXPECT_THROW(matmul_forward(out, ids, w, Tensor()), DTypeError);
  EXPECT_THROW(matmul_forward(out16, inp, w, Tensor()), DTypeError);
  Tensor dout = random_tensor(pool, {4, 5}, 3), none;
  Tensor dw16 = Tensor::empty(pool, {5, 8}, DType::bf16, Category::grads, "dw");
  EXPECT_THROW(matmul_backward(none, dw16, none, dout, inp, w), DTypeError);
}

TEST(Gemm, BadLeadingDimensionsAreShapeErrors) {
  std::vector<float> A(64), B(64), C(64);
  std::string msg = message_of<ShapeError>(
      [&] { gemm(false, false, 4, 4, 4, 1.0f, A.data(), 3, B.data(), 4, 0.0f, C.data(), 4); });
  EXPECT_NE(msg.find("[gemm] lda 3 is less than A's row length 4"), std::string::npos) << msg;
  EXPECT_THROW(gemm(false, true, 4, 4, 5, 1.0f, A.data(), 5, B.data(), 4, 0.0f, C.data(), 4),
               ShapeError);
  EXPECT_THROW(gemm(false, false, 4, 4, 4, 1.0f, A.data(), 4, B.data(), 4, 0.0f, C.data(), 3),
               ShapeError);
  EXPECT_THROW(gemm(false, false, 4, 4, 4, 1.0f, A.data(), 4, B.data(), 4, 0.5f, C.data(), 4),
               Error);
}

// A combination oneDNN cannot build (f16 source, bf16 weights) surfaces as a memfit::Error
// that quotes the failing oneDNN call.
TEST(Gemm, OneDnnFailureQuotesTheCall) {
  dnnl_gemm::GemmSpec s;
  s.M = s.N = s.K = s.lda = s.ldb = s.ldc = 4;
  s.b_type = DType::bf16;
  s.c_type = DType::bf16;
  s.a_type = DType::f16;
  std::vector<float> buf(16);
  std::string msg =
      message_of<Error>([&] { dnnl_gemm::execute(s, buf.data(), buf.data(), buf.data()); });
  EXPECT_NE(msg.find("[matmul] oneDNN call `dnnl::matmul::primitive_desc"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace memfit::kernels
