// Reference embedding: the obvious loops, in double.
#include "memfit/kernels/ref/embedding_ref.h"

namespace memfit::kernels::ref {

void embedding_forward_ref(double* out, const int32_t* tokens, const double* wte, const double* wpe,
                           int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const double* e = wte + static_cast<int64_t>(tokens[b * T + t]) * C;
      const double* p = wpe + t * C;
      double* o = out + (b * T + t) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void embedding_backward_ref(double* dwte, double* dwpe, const double* dout, const int32_t* tokens,
                            int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const double* g = dout + (b * T + t) * C;
      double* de = dwte + static_cast<int64_t>(tokens[b * T + t]) * C;
      double* dp = dwpe + t * C;
      for (int64_t c = 0; c < C; ++c) {
        de[c] += g[c];
        dp[c] += g[c];
      }
    }
  }
}

}  // namespace memfit::kernels::ref
