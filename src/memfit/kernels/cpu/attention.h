// Causal multi-head self-attention, plain form: the (T, T) probabilities of every head are
// saved for backward. This is the baseline that flash attention replaces.
#pragma once

#include "memfit/core/tensor.h"

namespace memfit::kernels {

// qkv (B,T,3C): q, k, v concatenated along the last dimension, head h at [h*hs, (h+1)*hs) of
// each; out (B,T,C); att (B,NH,T,T) receives the softmax probabilities (row t is zero past t).
// Scores are scaled by 1/sqrt(hs). All f32; mixed precision uses the overload below.
void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head);

// Mixed precision (docs/notes/mixed-precision.md): qkv, att and out each f32, bf16 or f16.
// A head's q, k, v are widened to f32 in the workspace, scores, softmax and products run in f32
// exactly as in the f32 kernel, and out and att are rounded once on store. out is computed from
// the f32 probabilities, before att rounds them. workspace: a contiguous f32 tensor of
// attention_forward_workspace_bytes (0 when everything is f32; it may then be undefined); a
// smaller one (at least one thread's slice) runs on fewer threads.
size_t attention_forward_workspace_bytes(int64_t B, int64_t T, int64_t C, int n_head, DType qkv,
                                         DType att, DType out);
void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, Tensor& workspace,
                       int n_head);

// Scratch the backward needs, in bytes, for these sizes (the caller allocates it as workspace):
// one (T, T) f32 slice per thread that will run, min(omp_get_max_threads(), B * n_head). With
// dtypes (of qkv, att, dout, dqkv), also the f32 copies of each half-precision operand of one
// head: a (T, T) for att, (T, hs) per q, k, v, dout, dq, dk, dv.
size_t attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C, int n_head);
size_t attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C, int n_head, DType qkv,
                                          DType att, DType dout, DType dqkv);

// dqkv (=) from dout (B,T,C), the saved qkv and att. workspace: contiguous f32 tensor of
// attention_backward_workspace_bytes bytes; a smaller one (at least one slice) runs on as many
// threads as it has slices. Each tensor may be f32, bf16 or f16 (the dtype-aware workspace size
// then applies); the arithmetic is the f32 kernel's on the widened values, dqkv rounds once.
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                        Tensor& workspace, int n_head);

}  // namespace memfit::kernels
