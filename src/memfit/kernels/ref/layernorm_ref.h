// Double-precision reference of LayerNorm (eps 1e-5): plain loops, checked by finite
// differences, that the fast kernel and the whole-model reference are measured against.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// R rows of C: out = (inp - mean) * rstd * w + b, saving mean and rstd (R) for backward.
void layernorm_forward_ref(double* out, double* mean, double* rstd, const double* inp,
                           const double* w, const double* b, int64_t R, int64_t C);
// dinp, dw, db all accumulate (+=), as the fast kernel (see cpu/layernorm.h).
void layernorm_backward_ref(double* dinp, double* dw, double* db, const double* dout,
                            const double* inp, const double* w, const double* mean,
                            const double* rstd, int64_t R, int64_t C);

}  // namespace memfit::kernels::ref
