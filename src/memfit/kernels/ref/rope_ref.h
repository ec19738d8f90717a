// Double-precision reference of rotary position embedding (Hugging Face's rotate-half form, see
// cpu/rope.h): the inverse frequencies (default and Llama 3 scaled) and the cos/sin table in
// exact arithmetic, and the rotation, checked by finite differences.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// hs/2 values theta^(-2i/hs); with factor > 0, Llama 3's scaling (low, high: the frequency
// factors; old_len: original_max_position_embeddings), all in double.
void rope_inv_freq_ref(double* inv_freq, int64_t hs, double theta, double factor = 0,
                       double low = 1, double high = 4, double old_len = 8192);
// table (T, hs): row t = cos(t inv_freq[i]) for i < hs/2, then sin(t inv_freq[i]).
void rope_table_ref(double* table, const double* inv_freq, int64_t T, int64_t hs);
// In place on qkv (B, T, (q + 2 kv) hs): the q and k heads of token (b, t) rotated by table row
// t; v untouched. Backward: the transposed rotation, on dq and dk.
void rope_forward_ref(double* qkv, const double* table, int64_t B, int64_t T, int64_t q_heads,
                      int64_t kv_heads, int64_t hs);
void rope_backward_ref(double* dqkv, const double* table, int64_t B, int64_t T, int64_t q_heads,
                       int64_t kv_heads, int64_t hs);

}  // namespace memfit::kernels::ref
