// Plain double-precision reference for causal multi-head attention: the ground truth for the
// fast kernel and a building block of the double-precision GPT-2 reference. Same layouts and
// meaning as kernels::attention_forward / attention_backward, on raw pointers.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// qkv (B, T, 3C): q, k, v of head h at [h*hs, (h+1)*hs) of each third, hs = C / n_head.
// out (B, T, C); att (B, n_head, T, T) gets the softmax probabilities of scores scaled by
// 1/sqrt(hs), row t zero past t.
void attention_forward(double* out, double* att, const double* qkv, int64_t B, int64_t T,
                       int64_t C, int64_t n_head);

// dqkv (B, T, 3C) (=) from dout (B, T, C), the saved qkv and att.
void attention_backward(double* dqkv, const double* dout, const double* qkv, const double* att,
                        int64_t B, int64_t T, int64_t C, int64_t n_head);

}  // namespace memfit::kernels::ref
