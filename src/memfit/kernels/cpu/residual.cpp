// Element-wise sums over whole activations and gradient slabs. They are memory-bound, so the
// point is one pass, all cores, full-width vectors, and sum_squares in double so a gradient
// norm over 124M parameters is exact to float precision. f32 only for now: a bf16 path adds a
// branch per function on dtype() that widens on load and rounds on store.
#include "memfit/kernels/cpu/residual.h"

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/vec_math.h"

namespace memfit::kernels {
namespace {

void add_f32(float* out, const float* a, const float* b, int64_t begin, int64_t end) {
  int64_t i = begin;
#if defined(__AVX512F__)
  for (; i + 16 <= end; i += 16)
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < end) {
    const __mmask16 m = vec::tail_mask(end - i);
    _mm512_mask_storeu_ps(
        out + i, m,
        _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
    return;
  }
#endif
  for (; i < end; ++i) out[i] = a[i] + b[i];
}

}  // namespace

void residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr std::string_view op = "residual_forward";
  const Shape& shape = expect_any_shape(a, op, "a");
  expect_tensor(b, op, "b", shape);
  expect_tensor(out, op, "out", shape);
  float* o = out.data<float>();
  const float *pa = a.data<float>(), *pb = b.data<float>();
  parallel_ranges(a.numel(), [&](int64_t begin, int64_t end) { add_f32(o, pa, pb, begin, end); });
}

void add_inplace(Tensor& dst, const Tensor& src) {
  constexpr std::string_view op = "add_inplace";
  expect_any_shape(dst, op, "dst");
  expect_any_shape(src, op, "src");
  MEMFIT_CHECK_SHAPE(dst.numel() == src.numel(), op, "dst {} and src {} differ in element count",
                     dst.shape(), src.shape());
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  parallel_ranges(dst.numel(), [&](int64_t begin, int64_t end) { add_f32(d, d, s, begin, end); });
}

void scale_inplace(Tensor& dst, float s) {
  expect_any_shape(dst, "scale_inplace", "dst");
  float* d = dst.data<float>();
  parallel_ranges(dst.numel(), [&](int64_t begin, int64_t end) {
    int64_t i = begin;
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(s);
    for (; i + 16 <= end; i += 16)
      _mm512_storeu_ps(d + i, _mm512_mul_ps(_mm512_loadu_ps(d + i), vs));
    if (i < end) {
      const __mmask16 m = vec::tail_mask(end - i);
      _mm512_mask_storeu_ps(d + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, d + i), vs));
      return;
    }
#endif
    for (; i < end; ++i) d[i] *= s;
  });
}

double sum_squares(const Tensor& t) {
  expect_any_shape(t, "sum_squares", "t");
  const float* x = t.data<float>();
  return parallel_sum(t.numel(), [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    double total = 0.0;
#if defined(__AVX512F__)
    // Squares of floats are exact in double; two accumulators hide the add latency.
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    for (; i + 16 <= end; i += 16) {
      const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
      const __m512d hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
      acc0 = _mm512_fmadd_pd(lo, lo, acc0);
      acc1 = _mm512_fmadd_pd(hi, hi, acc1);
    }
    total = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
#endif
    for (; i < end; ++i) total += static_cast<double>(x[i]) * x[i];
    return total;
  });
}

}  // namespace memfit::kernels
