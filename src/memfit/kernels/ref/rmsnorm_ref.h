// Double-precision reference of RMSNorm (Hugging Face's LlamaRMSNorm): plain loops, checked by
// finite differences, that the fast kernel is measured against.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// R rows of C: out = w * x * rstd with rstd = 1 / sqrt(mean(x^2) + eps), saved (R) for backward.
void rmsnorm_forward_ref(double* out, double* rstd, const double* inp, const double* w, int64_t R,
                         int64_t C, double eps);
// dinp and dw accumulate (+=), as the fast kernel (see cpu/rmsnorm.h).
void rmsnorm_backward_ref(double* dinp, double* dw, const double* dout, const double* inp,
                          const double* w, const double* rstd, int64_t R, int64_t C);

}  // namespace memfit::kernels::ref
