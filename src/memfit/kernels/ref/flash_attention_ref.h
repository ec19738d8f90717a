// Causal multi-head attention in double precision, written as plainly as possible: the
// reference that the tiled flash attention kernels (FP32 and BF16) are checked against, and
// itself checked by finite differences. Slow (it materialises every (T, T) score matrix) and
// meant only for tests on small shapes.
#pragma once

#include <cstdint>
#include <vector>

namespace memfit::kernels::ref {

// Sizes shared by the reference functions; qkv is (B, T, 3C) with q, k, v concatenated along
// the last dimension and head h at [h*hs, (h+1)*hs) of each, hs = C / n_head.
struct AttentionDims {
  int64_t B = 1, T = 1, C = 1;
  int n_head = 1;
  int64_t head_size() const { return C / n_head; }
};

// out (B, T, C) and lse (B, NH, T): lse[b,h,t] = log sum_{s<=t} exp(q_t . k_s / sqrt(hs)).
void attention_forward_ref(std::vector<double>& out, std::vector<double>& lse,
                           const std::vector<double>& qkv, const AttentionDims& d);

// dqkv (B, T, 3C) = gradient of sum(out * dout) with respect to qkv.
void attention_backward_ref(std::vector<double>& dqkv, const std::vector<double>& dout,
                            const std::vector<double>& qkv, const AttentionDims& d);

}  // namespace memfit::kernels::ref
