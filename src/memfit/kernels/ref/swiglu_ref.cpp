// Reference SwiGLU and its derivative, in double.
#include "memfit/kernels/ref/swiglu_ref.h"

#include <cmath>

namespace memfit::kernels::ref {

void swiglu_forward_ref(double* out, const double* gate_up, int64_t N, int64_t F) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double g = gate_up[n * 2 * F + f], u = gate_up[n * 2 * F + F + f];
      out[n * F + f] = g / (1.0 + std::exp(-g)) * u;
    }
}

void swiglu_backward_ref(double* dgate_up, const double* dout, const double* gate_up, int64_t N,
                         int64_t F) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double g = gate_up[n * 2 * F + f], u = gate_up[n * 2 * F + F + f];
      const double dy = dout[n * F + f];
      const double s = 1.0 / (1.0 + std::exp(-g));
      dgate_up[n * 2 * F + f] = dy * u * s * (1.0 + g * (1.0 - s));
      dgate_up[n * 2 * F + F + f] = dy * g * s;
    }
}

}  // namespace memfit::kernels::ref
