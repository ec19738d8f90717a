// Causal attention of a few new tokens over a key/value cache: the decode step of generation
// (Note [KV cache], docs/notes/kv-cache.md). The training kernels (attention.h, flash) take a
// whole (B, T) window whose queries, keys and values are all new; here the keys and values of
// earlier positions come from the cache and only S rows of queries are new.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memfit/memory/tensor.h"
#include "memfit/kernels/cpu/attention_heads.h"

namespace memfit::kernels {

// Row s of qkv (S, heads.qkv_width(hs)) is the token at position `position` + s; its query heads
// attend causally to cache rows [0, position + s] of k_cache and v_cache ((T_max, heads.kv * hs)
// each, rows up to position + S - 1 already written, the new tokens' included). Query head h
// reads key/value head heads.kv_of(h) (grouped-query). Scores are scaled by 1/sqrt(hs), the
// softmax and the products run in f32 on widened values; out (S, heads.q * hs) is rounded once
// on store. qkv, the caches and out each f32, bf16 or f16. scores: f32 workspace of at least
// cached_attention_scores_bytes(S, heads, T_max). One task per (row, query head), so the result
// does not depend on the thread count.
size_t cached_attention_scores_bytes(int64_t S, AttentionHeads heads, int64_t T_max);
void cached_attention_forward(Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                              const Tensor& v_cache, int64_t position, AttentionHeads heads,
                              Tensor& scores);

}  // namespace memfit::kernels
