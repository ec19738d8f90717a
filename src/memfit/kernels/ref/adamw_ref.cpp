// Reference AdamW step, in double.
#include "memfit/kernels/ref/adamw_ref.h"

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

}  // namespace memfit::kernels::ref
