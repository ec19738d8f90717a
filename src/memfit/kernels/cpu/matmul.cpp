// Linear layers and the general GEMM: argument checks that name the op and the shapes or dtypes
// at fault, then oneDNN (dnnl_gemm.h) for the products and an OpenMP column sum for dbias (one source
// for every SIMD target, simd.h). The
// bf16 variants differ only in the element types handed to oneDNN and in a widening column sum.
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

template <DType D>
void column_block(float* dbias, const half::Storage<D>* dout, int64_t R, int64_t N, int64_t j0,
                  int64_t w) {
  constexpr int64_t kBlock = 64;
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t wv = w / L * L;  // whole vectors; the rest column by column, same order
  HWY_ALIGN float acc[kBlock] = {};
  for (int64_t r = 0; r < R; ++r) {
    const half::Storage<D>* row = dout + r * N + j0;
    for (int64_t j = 0; j < wv; j += L)
      hn::Store(hn::Add(hn::Load(d, acc + j), load<D>(d, row + j)), d, acc + j);
    for (int64_t j = wv; j < w; ++j) acc[j] += half::load1<D>(row + j);
  }
  for (int64_t j = 0; j < w; ++j) dbias[j0 + j] += acc[j];
}

// dbias[j0, j0 + w) += column sums of dout (R, N) over that band of w <= 64 columns, each
// element widened to f32 (exact) and summed in f32 in row order.
void ColumnBlock(DType t, float* dbias, const void* dout, int64_t R, int64_t N, int64_t j0,
                 int64_t w) {
  if (t == DType::bf16)
    column_block<DType::bf16>(dbias, static_cast<const uint16_t*>(dout), R, N, j0, w);
  else
    column_block<DType::f32>(dbias, static_cast<const float*>(dout), R, N, j0, w);
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(ColumnBlock);

namespace {

constexpr std::string_view kOp = "matmul";

// Shape of `inp` with its last dimension replaced by n.
Shape with_last(const Shape& s, int64_t n) {
  Shape r = s;
  r[-1] = n;
  return r;
}

// A row length as a leading dimension: oneDNN wants strides >= 1 even for empty matrices.
int64_t ld(int64_t n) { return std::max<int64_t>(n, 1); }

// dbias (N) += column sums of dout (R, N) of f32 or bf16. Threads take blocks of 64 columns;
// each keeps its block's sums in a few vector registers' worth of locals, so dbias is read and
// written once.
void column_sum_accumulate_any(DType t, float* dbias, const void* dout, int64_t R, int64_t N) {
  constexpr int64_t kBlock = 64;
  const int64_t n_blocks = (N + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (R * N > kParallelGrain)
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const int64_t j0 = blk * kBlock, w = std::min(kBlock, N - j0);
    MEMFIT_SIMD_DISPATCH(ColumnBlock)(t, dbias, dout, R, N, j0, w);
  }
}

void column_sum_accumulate(float* dbias, const float* dout, int64_t R, int64_t N) {
  column_sum_accumulate_any(DType::f32, dbias, dout, R, N);
}

void column_sum_accumulate_bf16(float* dbias, const uint16_t* dout, int64_t R, int64_t N) {
  column_sum_accumulate_any(DType::bf16, dbias, dout, R, N);
}

// f16 operands: oneDNN 2.6 has no f16 matmul on the CPU (measured: no primitive descriptor
// for any f16 source/weights/destination combination), so say so rather than fail inside it.
void reject_f16(DType t, std::string_view name, const Shape& shape) {
  MEMFIT_CHECK_DTYPE(t != DType::f16, kOp,
                     "{} is f16 {}: oneDNN 2.6 has no f16 matmul on the CPU; use bf16 (or f32) "
                     "operands", name, shape);
}

// With bf16 operands an output or bias may be f32 or bf16: the dtype of `t` if it is one of
// those (f32 if t is undefined), else a DTypeError that names it.
DType f32_or_bf16(const Tensor& t, std::string_view name) {
  if (!t.defined()) return DType::f32;
  MEMFIT_CHECK_DTYPE(t.dtype() == DType::f32 || t.dtype() == DType::bf16, kOp,
                     "{} must be f32 or bf16 with bf16 operands, got {} {}", name,
                     dtype_name(t.dtype()), t.shape());
  return t.dtype();
}

void check_gemm_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                     int64_t ldb, int64_t ldc, float beta) {
  MEMFIT_CHECK_SHAPE(M >= 0 && N >= 0 && K >= 0, "gemm", "negative size M={} N={} K={}", M, N, K);
  const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  MEMFIT_CHECK_SHAPE(lda >= ld(a_cols), "gemm",
                     "lda {} is less than A's row length {} (M={} K={} trans_a={})", lda, a_cols,
                     M, K, trans_a);
  MEMFIT_CHECK_SHAPE(ldb >= ld(b_cols), "gemm",
                     "ldb {} is less than B's row length {} (K={} N={} trans_b={})", ldb, b_cols,
                     K, N, trans_b);
  MEMFIT_CHECK_SHAPE(ldc >= ld(N), "gemm",
                     "ldc {} is less than C's row length {}", ldc, N);
  MEMFIT_CHECK(beta == 0.0f || beta == 1.0f, "gemm", "beta must be 0 or 1, got {}", beta);
}

// bf16 operands where oneDNN has no native bf16 matmul (below AVX512_BF16): say which route works.
void require_bf16_gemm(const Shape& inp) {
  MEMFIT_CHECK_DTYPE(dnnl_gemm::bf16_native(), kOp,
                     "inp is bf16 {} but oneDNN has no native bf16 matmul on this CPU (ISA {}; it "
                     "needs AVX512_BF16 or AMX): widen the operands through matmul_widened.h, as "
                     "the model does",
                     inp, dnnl_gemm::isa());
}

// Read into named locals, not a structured binding: clang cannot capture one in an OpenMP
// region.
struct LinearDims {
  int64_t R, IC, OC;
};

// inp (N..., IC) of `dtype` and weight (OC, IC) of the same: the sizes, or a typed error.
LinearDims check_linear(const Tensor& inp, const Tensor& weight, DType dtype) {
  const Shape& is = expect_any_shape(inp, kOp, "inp", dtype);
  const Shape& ws = expect_any_shape(weight, kOp, "weight", dtype);
  MEMFIT_CHECK_SHAPE(is.rank() >= 1 && ws.rank() == 2, kOp,
                     "inp {} must have rank >= 1 and weight {} rank 2 (OC, IC)", is, ws);
  MEMFIT_CHECK_SHAPE(is[-1] == ws[1], kOp,
                     "inner dims differ: {} x {} (inp x weight, weight is (OC, IC))", is, ws);
  int64_t R = 1;  // the leading dims' product (numel / IC fails when IC = 0)
  for (int d = 0; d + 1 < is.rank(); ++d) R *= is[d];
  return {R, ws[1], ws[0]};
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc, beta);
  dnnl_gemm::GemmSpec s;
  s.M = M, s.N = N, s.K = K;
  s.trans_a = trans_a, s.trans_b = trans_b;
  s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  s.alpha = alpha, s.beta = beta;
  dnnl_gemm::execute(s, A, B, C);
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, const float* B, float beta, float* C) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, ld(trans_a ? M : K), B, ld(trans_b ? K : N), beta, C,
       ld(N));
}

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  KernelScope timed("matmul_forward");
  MEMFIT_CHECK(inp.defined(), kOp, "inp is undefined");
  const DType in_type = inp.dtype();
  reject_f16(in_type, "inp", inp.shape());
  MEMFIT_CHECK_DTYPE(in_type == DType::f32 || in_type == DType::bf16, kOp,
                     "inp must be f32 or bf16, got {} {}", dtype_name(in_type), inp.shape());
  const auto dims = check_linear(inp, weight, in_type);
  const int64_t R = dims.R, IC = dims.IC, OC = dims.OC;
  // bf16 inputs may write bf16 and take a bf16 bias; f32 inputs keep everything f32.
  const bool low = in_type == DType::bf16;
  const DType out_type = low ? f32_or_bf16(out, "out") : DType::f32;
  const DType bias_type = low ? f32_or_bf16(bias, "bias") : DType::f32;
  expect_tensor(out, kOp, "out", with_last(inp.shape(), OC), out_type);
  if (bias.defined()) expect_tensor(bias, kOp, "bias", Shape{OC}, bias_type);
  if (low && IC > 0) require_bf16_gemm(inp.shape());

  dnnl_gemm::GemmSpec s;  // out (R, OC) = inp (R, IC) @ weight^T (IC, OC) + bias
  s.M = R, s.N = OC, s.K = IC;
  s.trans_b = true;
  s.lda = ld(IC), s.ldb = ld(IC), s.ldc = ld(OC);
  s.bias = bias.defined();
  s.a_type = s.b_type = in_type;
  s.c_type = out_type;
  s.bias_type = bias_type;
  dnnl_gemm::execute(s, inp.raw_data(), weight.raw_data(), out.raw_data(),
                     bias.defined() ? bias.raw_data() : nullptr);
}

void matmul_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight) {
  KernelScope timed("matmul_backward");
  MEMFIT_CHECK(inp.defined(), kOp, "inp is undefined");
  const DType in_type = inp.dtype();
  reject_f16(in_type, "inp", inp.shape());
  if (in_type == DType::f32) {  // the FP32 path, as it always was
    const auto dims = check_linear(inp, weight, DType::f32);
    const int64_t R = dims.R, IC = dims.IC, OC = dims.OC;
    expect_tensor(dout, kOp, "dout", with_last(inp.shape(), OC));
    if (dweight.defined()) expect_tensor(dweight, kOp, "dweight", weight.shape());
    if (dinp.defined()) expect_tensor(dinp, kOp, "dinp", inp.shape());
    if (dbias.defined()) expect_tensor(dbias, kOp, "dbias", Shape{OC});
    const float* dout_p = dout.data<float>();

    if (dinp.defined()) {  // dinp (R, IC) = dout (R, OC) @ weight (OC, IC)
      gemm(false, false, R, IC, OC, 1.0f, dout_p, ld(OC), weight.data<float>(), ld(IC), 0.0f,
           dinp.data<float>(), ld(IC));
    }
    if (dweight.defined()) {  // dweight (OC, IC) += dout^T (OC, R) @ inp (R, IC)
      gemm(true, false, OC, IC, R, 1.0f, dout_p, ld(OC), inp.data<float>(), ld(IC), 1.0f,
           dweight.data<float>(), ld(IC));
    }
    if (dbias.defined()) column_sum_accumulate(dbias.data<float>(), dout_p, R, OC);
    return;
  }

  MEMFIT_CHECK_DTYPE(in_type == DType::bf16, kOp, "inp must be f32 or bf16, got {} {}",
                     dtype_name(in_type), inp.shape());
  const auto dims = check_linear(inp, weight, DType::bf16);
  const int64_t R = dims.R, IC = dims.IC, OC = dims.OC;
  MEMFIT_CHECK_DTYPE(!dout.defined() || dout.dtype() == DType::bf16, kOp,
                     "dout must be bf16 like inp and weight, got {} {} (convert an f32 gradient "
                     "to bf16 first)",
                     dtype_name(dout.dtype()), dout.shape());
  expect_tensor(dout, kOp, "dout", with_last(inp.shape(), OC), DType::bf16);
  if (dweight.defined()) expect_tensor(dweight, kOp, "dweight", weight.shape(), DType::f32);
  const DType dinp_type = f32_or_bf16(dinp, "dinp");
  if (dinp.defined()) expect_tensor(dinp, kOp, "dinp", inp.shape(), dinp_type);
  if (dbias.defined()) expect_tensor(dbias, kOp, "dbias", Shape{OC}, DType::f32);
  require_bf16_gemm(inp.shape());

  if (dinp.defined()) {  // dinp (R, IC) = dout (R, OC) @ weight (OC, IC)
    dnnl_gemm::GemmSpec s;
    s.M = R, s.N = IC, s.K = OC;
    s.lda = ld(OC), s.ldb = ld(IC), s.ldc = ld(IC);
    s.a_type = s.b_type = DType::bf16;
    s.c_type = dinp_type;
    dnnl_gemm::execute(s, dout.raw_data(), weight.raw_data(), dinp.raw_data());
  }
  if (dweight.defined()) {  // dweight (OC, IC) += dout^T (OC, R) @ inp (R, IC), in f32
    dnnl_gemm::GemmSpec s;
    s.M = OC, s.N = IC, s.K = R;
    s.trans_a = true;
    s.lda = ld(OC), s.ldb = ld(IC), s.ldc = ld(IC);
    s.beta = 1.0f;
    s.a_type = s.b_type = DType::bf16;
    dnnl_gemm::execute(s, dout.raw_data(), inp.raw_data(), dweight.raw_data());
  }
  if (dbias.defined()) {
    column_sum_accumulate_bf16(dbias.data<float>(), static_cast<const uint16_t*>(dout.raw_data()),
                               R, OC);
  }
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
