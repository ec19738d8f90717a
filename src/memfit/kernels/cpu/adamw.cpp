// AdamW's element-wise update, written to follow torch.optim.AdamW (single-tensor path)
// operation by operation so that memfit and PyTorch parameters agree to an ulp or two after a
// step, not just to the formula:
//   p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);  v = v b2 + ((1 - b2) g) g;
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) m / denom.
// The scalars are formed in double, as Python does, then rounded to float. The update streams
// four arrays in and three out, so it is memory-bound; divisions stay divisions (as in torch)
// because they are free next to the memory traffic.
#include "memfit/kernels/cpu/adamw.h"

#include <cmath>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/vec_math.h"

namespace memfit::kernels {
namespace {

// The per-step scalars, rounded to float once.
struct Coeffs {
  float grad_scale, decay, w1, b2, c2, bc2_sqrt, eps, neg_step;
};

Coeffs make_coeffs(const AdamWHyper& h, int64_t t, float grad_scale) {
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
  return {grad_scale,
          static_cast<float>(1.0 - lr * static_cast<double>(h.weight_decay)),
          static_cast<float>(1.0 - b1),
          h.beta2,
          static_cast<float>(1.0 - b2),
          static_cast<float>(std::sqrt(bc2)),
          h.eps,
          static_cast<float>(-lr / bc1)};
}

void update_range(float* p, const float* g, float* m, float* v, const Coeffs& k, int64_t begin,
                  int64_t end) {
  int64_t i = begin;
#if defined(__AVX512F__)
  const __m512 gs = _mm512_set1_ps(k.grad_scale), decay = _mm512_set1_ps(k.decay);
  const __m512 w1 = _mm512_set1_ps(k.w1), b2 = _mm512_set1_ps(k.b2), c2 = _mm512_set1_ps(k.c2);
  const __m512 bc2s = _mm512_set1_ps(k.bc2_sqrt), eps = _mm512_set1_ps(k.eps);
  const __m512 ns = _mm512_set1_ps(k.neg_step);
  for (; i < end; i += 16) {
    const __mmask16 msk = vec::tail_mask(end - i);
    const __m512 gv = _mm512_mul_ps(_mm512_maskz_loadu_ps(msk, g + i), gs);
    const __m512 pv = _mm512_mul_ps(_mm512_maskz_loadu_ps(msk, p + i), decay);
    __m512 mv = _mm512_maskz_loadu_ps(msk, m + i);
    mv = _mm512_fmadd_ps(w1, _mm512_sub_ps(gv, mv), mv);
    __m512 vv = _mm512_mul_ps(_mm512_maskz_loadu_ps(msk, v + i), b2);
    vv = _mm512_add_ps(vv, _mm512_mul_ps(_mm512_mul_ps(c2, gv), gv));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), bc2s), eps);
    const __m512 pn = _mm512_add_ps(pv, _mm512_div_ps(_mm512_mul_ps(ns, mv), denom));
    _mm512_mask_storeu_ps(m + i, msk, mv);
    _mm512_mask_storeu_ps(v + i, msk, vv);
    _mm512_mask_storeu_ps(p + i, msk, pn);
  }
#else
  for (; i < end; ++i) {
    const float gi = g[i] * k.grad_scale;
    const float pi = p[i] * k.decay;
    const float mi = m[i] + k.w1 * (gi - m[i]);
    const float vi = v[i] * k.b2 + (k.c2 * gi) * gi;
    const float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + (k.neg_step * mi) / denom;
  }
#endif
}

}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& h,
                  int64_t t, float grad_scale) {
  constexpr std::string_view op = "adamw_update";
  expect_any_shape(param, op, "param");
  expect_any_shape(grad, op, "grad");
  expect_any_shape(m, op, "m");
  expect_any_shape(v, op, "v");
  const int64_t n = param.numel();
  MEMFIT_CHECK_SHAPE(grad.numel() == n && m.numel() == n && v.numel() == n, op,
                     "param {}, grad {}, m {} and v {} must have the same element count",
                     param.shape(), grad.shape(), m.shape(), v.shape());
  MEMFIT_CHECK(t >= 1, op, "step t = {} must count from 1", t);
  const Coeffs k = make_coeffs(h, t, grad_scale);
  float *pp = param.data<float>(), *pm = m.data<float>(), *pv = v.data<float>();
  const float* pg = grad.data<float>();
  parallel_ranges(n,
                  [&](int64_t begin, int64_t end) { update_range(pp, pg, pm, pv, k, begin, end); });
}

}  // namespace memfit::kernels
