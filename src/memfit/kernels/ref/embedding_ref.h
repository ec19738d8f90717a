// Double-precision reference of the token plus position embedding: plain loops, checked by
// finite differences, that the fast kernel and the whole-model reference are measured against.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T), wte (V,C), wpe (>=T, C).
void embedding_forward_ref(double* out, const int32_t* tokens, const double* wte, const double* wpe,
                           int64_t B, int64_t T, int64_t C);
// dwte, dwpe accumulate (+=) from dout (B,T,C).
void embedding_backward_ref(double* dwte, double* dwpe, const double* dout, const int32_t* tokens,
                            int64_t B, int64_t T, int64_t C);

}  // namespace memfit::kernels::ref
