// Double-precision reference of GELU (tanh form, as GPT-2), checked by finite differences.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) over n elements.
void gelu_forward_ref(double* out, const double* inp, int64_t n);
// dinp (=) = gelu'(inp) * dout.
void gelu_backward_ref(double* dinp, const double* inp, const double* dout, int64_t n);

}  // namespace memfit::kernels::ref
