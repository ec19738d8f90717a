// Causal self-attention, memory-efficient (FlashAttention-2) form: scores are made and consumed
// one (query tile, key tile) block at a time with an online softmax, so forward saves only `out`
// and one log-sum-exp per query row instead of the (B, NH, T, T) probabilities that attention.h
// keeps; backward recomputes the probabilities tile by tile. Multi-head (GPT-2) and grouped-query
// (LLaMA: key/value heads shared by groups of query heads, attention_heads.h) alike; an int where
// AttentionHeads is taken means multi-head. Design, tile sizes and tolerances:
// docs/notes/flash-attention.md, "Note [Flash attention]".
#pragma once

#include <cstddef>
#include <cstdint>

#include "memfit/memory/tensor.h"
#include "memfit/kernels/cpu/attention_heads.h"

namespace memfit::kernels {

// Query rows and key rows per tile. The defaults are tuned for Sapphire Rapids (see the note);
// other values exist for tests and tuning. Both must be multiples of 16 in [16, 512].
struct FlashAttentionTiles {
  int q_rows = 64;
  int kv_rows = 128;
};

// Scratch bytes flash_attention_forward needs for these sizes (C = heads.out_width(hs), the
// width of out): tile buffers (about 0.1 MB at head size 64) for each of omp_get_max_threads()
// threads. The caller allocates it from the pool as Category::workspace.
size_t flash_attention_forward_workspace_bytes(int64_t B, int64_t T, int64_t C,
                                               AttentionHeads heads,
                                               DType dtype = DType::f32,
                                               const FlashAttentionTiles& tiles = {});

// qkv (B, T, heads.qkv_width(hs)): per token [q heads | k heads | v heads], head h of each part
// at [h*hs, (h+1)*hs), query head h reading key/value head heads.kv_of(h) (the layout of
// attention.h; (B, T, 3C) for multi-head). Scores are scaled by 1/sqrt(hs), position t attends
// to positions <= t.
//   out (B, T, C), C = heads.out_width(hs): same dtype as qkv (f32 or bf16).
//   lse (B, heads.q, T) f32: log sum_{s<=t} exp(score(t, s)), all that backward needs besides
//   out.
//   workspace: any contiguous tensor of at least flash_attention_forward_workspace_bytes bytes
//   (a ShapeError if it holds less than one thread's tile buffers; with fewer threads' than
//   omp_get_max_threads(), fewer threads run).
// With bf16 qkv (even head size) the tile products take bf16 operands and accumulate in f32, on
// AMX tiles where the machine has them, else AVX512_BF16; out is bf16, within 1e-2 relative of
// exact attention on the same inputs (f32: 1e-5). Each output row is computed by one task in a
// fixed order, so out and lse are bit-identical from run to run and for any thread count.
void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, Tensor& workspace,
                             AttentionHeads heads, const FlashAttentionTiles& tiles = {});

// Scratch bytes flash_attention_backward needs for these sizes (C the width of out): rowsum(dout
// * out) per query row, tile buffers for each of omp_get_max_threads() threads, and f32 dq
// buffers (B, T, C) for the key-tile groups after the first (and, for bf16, the first too): none
// for f32 when B * heads.kv >= 4 * threads. The caller allocates it from the pool as
// Category::workspace.
size_t flash_attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C,
                                                AttentionHeads heads,
                                                DType dtype = DType::f32,
                                                const FlashAttentionTiles& tiles = {});

// dqkv (=, same shape and dtype as qkv) from dout (B, T, C, dtype of qkv), the saved qkv, out
// and lse. dk and dv of a key/value head are the sums over the query heads that share it.
// workspace: any contiguous tensor of at least flash_attention_backward_workspace_bytes bytes (a
// ShapeError if it holds less than one thread's share); with room for fewer threads than
// omp_get_max_threads(), fewer threads run. Deterministic: dqkv is bit-identical from run to run
// for the same inputs and thread count (the number the workspace allows, up to
// omp_get_max_threads()); one task owns each key/value head's dk, dv rows and sums its group's
// query heads in a fixed order, no atomics. dk and dv do not depend on the thread count at all;
// dq does only through the number of key-tile groups, which is one whenever
// B * heads.kv >= 4 * threads. See "Determinism" and "Grouped-query attention" in the note.
void flash_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                              const Tensor& out, const Tensor& lse, Tensor& workspace,
                              AttentionHeads heads, const FlashAttentionTiles& tiles = {});

}  // namespace memfit::kernels
