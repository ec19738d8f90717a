// Causal multi-head self-attention, plain form: the (T, T) probabilities of every head are
// saved for backward. This is the baseline that flash attention replaces.
#pragma once

#include "memfit/core/tensor.h"

namespace memfit::kernels {

// qkv (B,T,3C): q, k, v concatenated along the last dimension, head h at [h*hs, (h+1)*hs) of
// each; out (B,T,C); att (B,NH,T,T) receives the softmax probabilities (row t is zero past t).
// Scores are scaled by 1/sqrt(hs).
void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head);

// Scratch the backward needs, in bytes, for these sizes (the caller allocates it as workspace):
// one (T, T) f32 slice per thread that will run, min(omp_get_max_threads(), B * n_head).
size_t attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C, int n_head);

// dqkv (=) from dout (B,T,C), the saved qkv and att. workspace: contiguous f32 tensor of
// attention_backward_workspace_bytes bytes; a smaller one (at least one (T, T) slice) runs on
// as many threads as it has slices.
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                        Tensor& workspace, int n_head);

}  // namespace memfit::kernels
