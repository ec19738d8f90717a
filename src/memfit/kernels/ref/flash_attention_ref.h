// Causal self-attention (multi-head or grouped-query) in double precision, written as plainly as
// possible: the
// reference that the tiled flash attention kernels (FP32 and BF16) are checked against, and
// itself checked by finite differences. Slow (it materialises every (T, T) score matrix) and
// meant only for tests on small shapes.
#pragma once

#include <cstdint>
#include <vector>

#include "memfit/kernels/cpu/attention_heads.h"

namespace memfit::kernels::ref {

// Sizes shared by the reference functions. C is the output width, heads.q * hs; qkv is
// (B, T, heads.qkv_width(hs)): per token [q heads | k heads | v heads], head h of each part at
// [h*hs, (h+1)*hs), query head h reading key/value head heads.kv_of(h) (attention_heads.h). An
// int heads is multi-head attention, qkv (B, T, 3C).
struct AttentionDims {
  int64_t B = 1, T = 1, C = 1;
  AttentionHeads heads = 1;
  int64_t head_size() const { return C / heads.q; }
  int64_t qkv_width() const { return heads.qkv_width(head_size()); }
};

// out (B, T, C) and lse (B, heads.q, T): lse[b,h,t] = log sum_{s<=t} exp(q_t . k_s / sqrt(hs)).
void attention_forward_ref(std::vector<double>& out, std::vector<double>& lse,
                           const std::vector<double>& qkv, const AttentionDims& d);

// dqkv (B, T, qkv_width()) = gradient of sum(out * dout) with respect to qkv.
void attention_backward_ref(std::vector<double>& dqkv, const std::vector<double>& dout,
                            const std::vector<double>& qkv, const AttentionDims& d);

}  // namespace memfit::kernels::ref
