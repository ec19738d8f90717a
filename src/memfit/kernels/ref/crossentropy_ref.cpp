// Reference cross-entropy: max-subtracted softmax in double, one row at a time.
#include "memfit/kernels/ref/crossentropy_ref.h"

#include <cmath>

namespace memfit::kernels::ref {

namespace {
// Max and sum of exp(x - max) over the first V entries of a row.
void row_softmax_stats(const double* x, int64_t V, double* mx, double* sum) {
  *mx = x[0];
  for (int64_t i = 1; i < V; ++i) *mx = x[i] > *mx ? x[i] : *mx;
  *sum = 0.0;
  for (int64_t i = 0; i < V; ++i) *sum += std::exp(x[i] - *mx);
}
}  // namespace

void crossentropy_forward_ref(double* losses, const double* logits, const int32_t* targets,
                              int64_t R, int64_t Vp, int64_t V, const uint8_t* mask) {
  for (int64_t r = 0; r < R; ++r) {
    const double* x = logits + r * Vp;
    double mx, sum;
    row_softmax_stats(x, V, &mx, &sum);
    losses[r] = (std::log(sum) + mx - x[targets[r]]) * (mask ? mask[r] : 1.0);
  }
}

void crossentropy_backward_ref(double* dlogits, const double* logits, const int32_t* targets,
                               int64_t R, int64_t Vp, int64_t V, double dloss,
                               const uint8_t* mask) {
  for (int64_t r = 0; r < R; ++r) {
    const double* x = logits + r * Vp;
    double* d = dlogits + r * Vp;
    double mx, sum;
    row_softmax_stats(x, V, &mx, &sum);
    const double weight = dloss * (mask ? mask[r] : 1.0);
    for (int64_t i = 0; i < V; ++i) {
      const double p = std::exp(x[i] - mx) / sum;
      d[i] = (p - (i == targets[r] ? 1.0 : 0.0)) * weight;
    }
    for (int64_t i = V; i < Vp; ++i) d[i] = 0.0;
  }
}

}  // namespace memfit::kernels::ref
