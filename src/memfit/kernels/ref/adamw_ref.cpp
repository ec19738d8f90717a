// Reference AdamW step, in double.
#include "memfit/kernels/ref/adamw_ref.h"

#include <algorithm>
#include <cmath>

namespace memfit::kernels::ref {

void adamw_update_ref(double* p, const double* g, double* m, double* v, int64_t n,
                      const AdamWRefHyper& h, int64_t t, double grad_scale) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g[i] * grad_scale;
    p[i] -= h.lr * h.weight_decay * p[i];
    m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * gi;
    v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * gi * gi;
    p[i] -= h.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + h.eps);
  }
}

double bf16_round_ref(double x) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  // 8 significant bits: the ulp is 2^(e - 8), floored at bf16's subnormal step 2^-133.
  const double ulp = std::ldexp(1.0, std::max(e, -125) - 8);
  return std::nearbyint(x / ulp) * ulp;  // the default rounding mode: ties to even
}

void adamw_update_bf16_state_ref(double* p, const double* g, double* m, double* v, int64_t n,
                                 const AdamWRefHyper& h, int64_t t, double grad_scale) {
  adamw_update_ref(p, g, m, v, n, h, t, grad_scale);
  for (int64_t i = 0; i < n; ++i) {
    m[i] = bf16_round_ref(m[i]);
    v[i] = bf16_round_ref(v[i]);
  }
}

}  // namespace memfit::kernels::ref
