// Causal self-attention, plain form: the (T, T) probabilities of every query head are saved for
// backward. This is the baseline that flash attention replaces. Multi-head (GPT-2) and
// grouped-query (LLaMA: key/value heads shared by groups of query heads, attention_heads.h)
// alike; an int where AttentionHeads is taken means multi-head.
#pragma once

#include "memfit/memory/tensor.h"
#include "memfit/kernels/cpu/attention_heads.h"

namespace memfit::kernels {

// qkv (B, T, heads.qkv_width(hs)): per token [q heads | k heads | v heads], head h of each part
// at [h*hs, (h+1)*hs); query head h reads key/value head heads.kv_of(h). Multi-head, that is
// (B, T, 3C). out (B, T, C) with C = heads.out_width(hs); att (B, heads.q, T, T) receives the
// softmax probabilities (row t is zero past t). Scores are scaled by 1/sqrt(hs). All f32; mixed
// precision uses the overload below. Each (b, query head) is one task's, so out and att do not
// depend on the thread count.
void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, AttentionHeads heads);

// Mixed precision (docs/notes/mixed-precision.md): qkv, att and out each f32, bf16 or f16.
// A head's q, k, v are widened to f32 in the workspace, scores, softmax and products run in f32
// exactly as in the f32 kernel, and out and att are rounded once on store. out is computed from
// the f32 probabilities, before att rounds them. workspace: a contiguous f32 tensor of
// attention_forward_workspace_bytes (0 when everything is f32; it may then be undefined); a
// smaller one (at least one thread's slice) runs on fewer threads. C is the output width, as
// everywhere in this header.
size_t attention_forward_workspace_bytes(int64_t B, int64_t T, int64_t C, AttentionHeads heads,
                                         DType qkv, DType att, DType out);
void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, Tensor& workspace,
                       AttentionHeads heads);

// Scratch the backward needs, in bytes, for these sizes (the caller allocates it as workspace):
// one (T, T) f32 slice per thread that will run, min(omp_get_max_threads(), B * heads.kv). With
// dtypes (of qkv, att, dout, dqkv), also the f32 copies of each half-precision operand of one
// head: a (T, T) for att, (T, hs) per q, k, v, dout, dq, dk, dv.
size_t attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C, AttentionHeads heads);
size_t attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C, AttentionHeads heads,
                                          DType qkv, DType att, DType dout, DType dqkv);

// dqkv (=) from dout (B, T, C), the saved qkv and att. workspace: contiguous f32 tensor of
// attention_backward_workspace_bytes bytes; a smaller one (at least one slice) runs on as many
// threads as it has slices. Each tensor may be f32, bf16 or f16 (the dtype-aware workspace size
// then applies); the arithmetic is the f32 kernel's on the widened values, dqkv rounds once.
// One task per (b, key/value head) computes dq of the group's query heads and dk, dv as the sum
// over them in head order, so dqkv is the same for any thread count.
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                        Tensor& workspace, AttentionHeads heads);

}  // namespace memfit::kernels
