// Reference element-wise sums, in double.
#include "memfit/kernels/ref/residual_ref.h"

namespace memfit::kernels::ref {

void residual_forward_ref(double* out, const double* a, const double* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward_ref(double* da, double* db, const double* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

void add_inplace_ref(double* dst, const double* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void scale_inplace_ref(double* dst, double s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] *= s;
}

double sum_squares_ref(const double* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

}  // namespace memfit::kernels::ref
