// Reference RMSNorm: the mean of squares and the textbook backward, in double.
#include "memfit/kernels/ref/rmsnorm_ref.h"

#include <cmath>

namespace memfit::kernels::ref {

void rmsnorm_forward_ref(double* out, double* rstd, const double* inp, const double* w, int64_t R,
                         int64_t C, double eps) {
  for (int64_t r = 0; r < R; ++r) {
    const double* x = inp + r * C;
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += x[c] * x[c];
    ms /= static_cast<double>(C);
    const double s = 1.0 / std::sqrt(ms + eps);
    for (int64_t c = 0; c < C; ++c) out[r * C + c] = w[c] * (x[c] * s);
    rstd[r] = s;
  }
}

void rmsnorm_backward_ref(double* dinp, double* dw, const double* dout, const double* inp,
                          const double* w, const double* rstd, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; ++r) {
    const double* x = inp + r * C;
    const double* dy = dout + r * C;
    const double s = rstd[r];
    // norm = x * s; d rstd / d x_c = -x_c s^3 / C, so
    // dx = (w * dy - norm * mean(w * dy * norm)) * s.
    double dnorm_norm_mean = 0.0;
    for (int64_t c = 0; c < C; ++c) dnorm_norm_mean += w[c] * dy[c] * x[c] * s;
    dnorm_norm_mean /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double norm = x[c] * s;
      dw[c] += norm * dy[c];
      dinp[r * C + c] += (w[c] * dy[c] - norm * dnorm_norm_mean) * s;
    }
  }
}

}  // namespace memfit::kernels::ref
