// Double-precision reference of SwiGLU (silu(g) * u over [g | u] rows), checked by finite
// differences.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// gate_up (N, 2F), out (N, F) = silu(g) * u, silu(g) = g / (1 + exp(-g)).
void swiglu_forward_ref(double* out, const double* gate_up, int64_t N, int64_t F);
// dgate_up (=) (N, 2F): dg = dout * u * silu'(g), du = dout * silu(g).
void swiglu_backward_ref(double* dgate_up, const double* dout, const double* gate_up, int64_t N,
                         int64_t F);

}  // namespace memfit::kernels::ref
