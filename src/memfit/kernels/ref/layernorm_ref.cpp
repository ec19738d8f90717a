// Reference LayerNorm: two-pass statistics and the textbook backward, in double.
#include "memfit/kernels/ref/layernorm_ref.h"

#include <cmath>

namespace memfit::kernels::ref {

namespace {
constexpr double kEps = 1e-5;
}

void layernorm_forward_ref(double* out, double* mean, double* rstd, const double* inp,
                           const double* w, const double* b, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; ++r) {
    const double* x = inp + r * C;
    double m = 0.0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= static_cast<double>(C);
    double var = 0.0;
    for (int64_t c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= static_cast<double>(C);
    const double s = 1.0 / std::sqrt(var + kEps);
    for (int64_t c = 0; c < C; ++c) out[r * C + c] = (x[c] - m) * s * w[c] + b[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward_ref(double* dinp, double* dw, double* db, const double* dout,
                            const double* inp, const double* w, const double* mean,
                            const double* rstd, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; ++r) {
    const double* x = inp + r * C;
    const double* dy = dout + r * C;
    // dnorm = w * dy; dx = (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd.
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double norm = (x[c] - mean[r]) * rstd[r];
      dnorm_mean += w[c] * dy[c];
      dnorm_norm_mean += w[c] * dy[c] * norm;
    }
    dnorm_mean /= static_cast<double>(C);
    dnorm_norm_mean /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double norm = (x[c] - mean[r]) * rstd[r];
      db[c] += dy[c];
      dw[c] += norm * dy[c];
      dinp[r * C + c] += (w[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * rstd[r];
    }
  }
}

}  // namespace memfit::kernels::ref
