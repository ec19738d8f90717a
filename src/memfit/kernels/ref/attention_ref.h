// Plain double-precision reference for causal self-attention, multi-head or grouped-query:
// the ground truth for the fast kernel and a building block of the double-precision model
// references. Same layouts and meaning as kernels::attention_forward / attention_backward, on raw
// pointers.
#pragma once

#include <cstdint>

#include "memfit/kernels/cpu/attention_heads.h"

namespace memfit::kernels::ref {

// qkv (B, T, heads.qkv_width(hs)): per token [q heads | k heads | v heads], head h of each part
// at [h*hs, (h+1)*hs), hs = C / heads.q; query head h reads key/value head heads.kv_of(h).
// out (B, T, C), C = heads.out_width(hs); att (B, heads.q, T, T) gets the softmax probabilities
// of scores scaled by 1/sqrt(hs), row t zero past t. An int heads is multi-head: qkv (B, T, 3C).
void attention_forward(double* out, double* att, const double* qkv, int64_t B, int64_t T,
                       int64_t C, AttentionHeads heads);

// dqkv (B, T, heads.qkv_width(hs)) (=) from dout (B, T, C), the saved qkv and att. The dk, dv
// of a key/value head sum over the query heads that share it.
void attention_backward(double* dqkv, const double* dout, const double* qkv, const double* att,
                        int64_t B, int64_t T, int64_t C, AttentionHeads heads);

}  // namespace memfit::kernels::ref
