// LayerNorm forward and backward over rows of C floats. A row (3 KiB at C = 768) stays in L1,
// so the extra passes of two-pass statistics cost little and buy accuracy: the mean, then the
// centred sum of squares, each kept in float vectors and finished in double. Backward splits
// rows over threads; dweight and dbias go through per-thread partials that are added in
// thread order, so results do not depend on scheduling.
// Mixed precision: the output may be bf16 or f16 (rounded once, from the f32 result), and the
// weight and bias may be a bf16 / f16 working copy, widened once per call; the input, the
// statistics and the whole backward stay f32 (see docs/notes/mixed-precision.md).
#include "memfit/kernels/cpu/layernorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/half_vec.h"
#include "memfit/kernels/cpu/vec_math.h"

namespace memfit::kernels {
namespace {

struct RowStats {
  float mean;
  float rstd;
};

RowStats row_stats(const float* x, int64_t C) {
  double sum = 0.0, sq = 0.0;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  for (; i + 32 <= C; i += 32) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
  }
  for (; i < C; i += 16)
    a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(vec::tail_mask(C - i), x + i));
  sum = vec::reduce_add_pd(_mm512_add_ps(a0, a1));
  const float mean = static_cast<float>(sum / static_cast<double>(C));
  const __m512 vm = _mm512_set1_ps(mean);
  a0 = a1 = _mm512_setzero_ps();
  for (i = 0; i + 32 <= C; i += 32) {
    const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
    const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vm);
    a0 = _mm512_fmadd_ps(d0, d0, a0);
    a1 = _mm512_fmadd_ps(d1, d1, a1);
  }
  for (; i < C; i += 16) {
    const __mmask16 m = vec::tail_mask(C - i);
    const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), vm);
    a0 = _mm512_fmadd_ps(d, d, a0);
  }
  sq = vec::reduce_add_pd(_mm512_add_ps(a0, a1));
#else
  for (; i < C; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / static_cast<double>(C));
  for (i = 0; i < C; ++i) {
    const double d = static_cast<double>(x[i]) - mean;
    sq += d * d;
  }
#endif
  const double var = sq / static_cast<double>(C);
  return {mean, static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(kLayerNormEps)))};
}

template <DType D>
void row_forward(half::Storage<D>* out, const float* x, const float* w, const float* b, RowStats s,
                 int64_t C) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vm = _mm512_set1_ps(s.mean), vr = _mm512_set1_ps(s.rstd);
  for (; i < C; i += 16) {
    const __mmask16 m = vec::tail_mask(C - i);
    const __m512 n = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm), vr);
    half::mask_store16<D>(
        out + i, m,
        _mm512_fmadd_ps(n, _mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
#else
  for (; i < C; ++i) half::store1<D>(out + i, (x[i] - s.mean) * s.rstd * w[i] + b[i]);
#endif
}

// One row of the backward (see layernorm.h for the conventions): dw_part and db_part are this
// thread's partial sums of dweight and dbias.
void row_backward(float* dx, float* dw_part, float* db_part, const float* dy, const float* x,
                  const float* w, RowStats s, int64_t C) {
  // Pass 1: the two row means the input gradient needs, and the parameter partials.
  double dnorm_sum = 0.0, dnorm_norm_sum = 0.0;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vm = _mm512_set1_ps(s.mean), vr = _mm512_set1_ps(s.rstd);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  for (; i < C; i += 16) {
    const __mmask16 m = vec::tail_mask(C - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, dy + i);
    const __m512 n = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm), vr);
    const __m512 dn = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), g);
    a0 = _mm512_add_ps(a0, dn);
    a1 = _mm512_fmadd_ps(dn, n, a1);
    _mm512_mask_storeu_ps(db_part + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, db_part + i), g));
    _mm512_mask_storeu_ps(dw_part + i, m,
                          _mm512_fmadd_ps(n, g, _mm512_maskz_loadu_ps(m, dw_part + i)));
  }
  dnorm_sum = vec::reduce_add_pd(a0);
  dnorm_norm_sum = vec::reduce_add_pd(a1);
#else
  for (; i < C; ++i) {
    const float n = (x[i] - s.mean) * s.rstd;
    const float dn = w[i] * dy[i];
    dnorm_sum += dn;
    dnorm_norm_sum += static_cast<double>(dn) * n;
    db_part[i] += dy[i];
    dw_part[i] += n * dy[i];
  }
#endif
  const float dnorm_mean = static_cast<float>(dnorm_sum / static_cast<double>(C));
  const float dnorm_norm_mean = static_cast<float>(dnorm_norm_sum / static_cast<double>(C));
  // Pass 2: dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd.
  i = 0;
#if defined(__AVX512F__)
  const __m512 vdm = _mm512_set1_ps(dnorm_mean), vdnm = _mm512_set1_ps(dnorm_norm_mean);
  for (; i < C; i += 16) {
    const __mmask16 m = vec::tail_mask(C - i);
    const __m512 n = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm), vr);
    const __m512 dn =
        _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, dy + i));
    const __m512 t = _mm512_fnmadd_ps(n, vdnm, _mm512_sub_ps(dn, vdm));
    _mm512_mask_storeu_ps(dx + i, m, _mm512_fmadd_ps(t, vr, _mm512_maskz_loadu_ps(m, dx + i)));
  }
#else
  for (; i < C; ++i) {
    const float n = (x[i] - s.mean) * s.rstd;
    const float dn = w[i] * dy[i];
    dx[i] += (dn - dnorm_mean - n * dnorm_norm_mean) * s.rstd;
  }
#endif
}

// A weight or bias (C) of f32, bf16 or f16.
void expect_param(const Tensor& t, std::string_view op, std::string_view name, int64_t C) {
  MEMFIT_CHECK(t.defined(), op, "{} is undefined", name);
  MEMFIT_CHECK_DTYPE(half::is_float_type(t.dtype()), op, "{} must be f32, bf16 or f16, got {} {}",
                     name, dtype_name(t.dtype()), t.shape());
  expect_tensor(t, op, name, Shape{C}, t.dtype());
}

// A weight or bias as f32: its own data if it is f32, else a widened copy kept in `buf` (C
// floats, a few KiB: below the pool's notice, like the backward's partials).
const float* as_f32(const Tensor& t, std::vector<float>& buf) {
  if (t.dtype() == DType::f32) return t.data<float>();
  buf.resize(static_cast<size_t>(t.numel()));
  half::dispatch(t.dtype(), [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    half::convert_n<D, DType::f32>(buf.data(), static_cast<const half::Storage<D>*>(t.raw_data()),
                                   t.numel());
  });
  return buf.data();
}

// Shapes shared by forward and backward: R rows of C, mean and rstd of R elements (any shape,
// so (B, T) works as well as (R)).
struct Dims {
  int64_t R, C;
};

Dims check_dims(std::string_view op, const Tensor& inp, const Tensor& weight, const Tensor& mean,
                const Tensor& rstd) {
  const Shape& shape = expect_any_shape(inp, op, "inp");
  MEMFIT_CHECK_SHAPE(shape.rank() >= 1 && shape[-1] > 0, op, "inp {} needs a last dimension > 0",
                     shape);
  const int64_t C = shape[-1], R = shape.numel() / C;
  expect_param(weight, op, "weight", C);
  expect_any_shape(mean, op, "mean");
  expect_any_shape(rstd, op, "rstd");
  MEMFIT_CHECK_SHAPE(mean.numel() == R && rstd.numel() == R, op,
                     "mean {} and rstd {} must hold one value per row of inp {} ({} rows)",
                     mean.shape(), rstd.shape(), shape, R);
  return {R, C};
}

}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias) {
  constexpr std::string_view op = "layernorm_forward";
  const auto [R, C] = check_dims(op, inp, weight, mean, rstd);
  expect_param(bias, op, "bias", C);
  MEMFIT_CHECK(out.defined(), op, "out is undefined");
  MEMFIT_CHECK_DTYPE(half::is_float_type(out.dtype()), op,
                     "out must be f32, bf16 or f16, got {} {}", dtype_name(out.dtype()),
                     out.shape());
  expect_tensor(out, op, "out", inp.shape(), out.dtype());
  float *pm = mean.data<float>(), *pr = rstd.data<float>();
  std::vector<float> wbuf, bbuf;
  const float *x = inp.data<float>(), *w = as_f32(weight, wbuf), *b = as_f32(bias, bbuf);
  half::dispatch(out.dtype(), [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* o = static_cast<half::Storage<D>*>(out.raw_data());
#pragma omp parallel for schedule(static) if (R * C > 8192)
    for (int64_t r = 0; r < R; ++r) {
      const RowStats s = row_stats(x + r * C, C);
      row_forward<D>(o + r * C, x + r * C, w, b, s, C);
      pm[r] = s.mean;
      pr[r] = s.rstd;
    }
  });
}

void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  constexpr std::string_view op = "layernorm_backward";
  const auto [R, C] = check_dims(op, inp, weight, mean, rstd);
  expect_tensor(dout, op, "dout", inp.shape());
  expect_tensor(dinp, op, "dinp", inp.shape());
  expect_tensor(dweight, op, "dweight", Shape{C});
  expect_tensor(dbias, op, "dbias", Shape{C});
  float *dx = dinp.data<float>(), *dw = dweight.data<float>(), *db = dbias.data<float>();
  std::vector<float> wbuf;
  const float *dy = dout.data<float>(), *x = inp.data<float>(), *w = as_f32(weight, wbuf);
  const float *pm = mean.data<float>(), *pr = rstd.data<float>();

  // Per-thread partials of dweight and dbias: 2 C floats a thread, a few KiB, below the
  // pool's notice.
  std::vector<float> partial(static_cast<size_t>(omp_get_max_threads()) * 2 * C, 0.0f);
#pragma omp parallel if (R * C > 8192)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    float* dw_part = partial.data() + tid * 2 * C;
    float* db_part = dw_part + C;
    for (int64_t r = R * tid / nth; r < R * (tid + 1) / nth; ++r) {
      row_backward(dx + r * C, dw_part, db_part, dy + r * C, x + r * C, w, {pm[r], pr[r]}, C);
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      float sw = 0.0f, sb = 0.0f;
      for (int64_t t = 0; t < nth; ++t) {
        sw += partial[t * 2 * C + c];
        sb += partial[t * 2 * C + C + c];
      }
      dw[c] += sw;
      db[c] += sb;
    }
  }
}

}  // namespace memfit::kernels
