// Reference GELU and its derivative, in double.
#include "memfit/kernels/ref/gelu_ref.h"

#include <cmath>

namespace memfit::kernels::ref {

namespace {
const double kBeta = std::sqrt(2.0 / M_PI);
constexpr double kKappa = 0.044715;
}  // namespace

void gelu_forward_ref(double* out, const double* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i];
    out[i] = 0.5 * x * (1.0 + std::tanh(kBeta * (x + kKappa * x * x * x)));
  }
}

void gelu_backward_ref(double* dinp, const double* inp, const double* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i];
    const double t = std::tanh(kBeta * (x + kKappa * x * x * x));
    const double sech2 = 1.0 - t * t;
    const double grad = 0.5 * (1.0 + t) + 0.5 * x * sech2 * kBeta * (1.0 + 3.0 * kKappa * x * x);
    dinp[i] = grad * dout[i];
  }
}

}  // namespace memfit::kernels::ref
