// The token embedding split by vocabulary rows across a tensor group (Megatron-LM's
// VocabParallelEmbedding): each rank holds rows [begin, begin + rows) of the table, looks up
// the tokens its slice holds and writes zeros for the rest; the group's sum is every token's
// row (the other ranks add exact zeros, so the bits of the whole table's lookup), then the
// position table (GPT-2; whole on every rank) is added once (under --sp the sum is a
// reduce-scatter: each rank keeps its rows of the sequence). The backward is local: a rank
// scatter-adds d(output) into the rows it holds, and every rank into the whole position table
// (the same gradient on each: a replicated parameter). Note [Tensor parallel] in
// docs/notes/tensor-parallel.md, "Collectives in BlockStep".
#pragma once

#include <cstdint>

#include "memfit/model/tensor_group.h"

namespace memfit {

class Tensor;

// out (B, T, C) f32 = wte[token] + wpe[position] over the group: wte (rows, C) this rank's rows
// from `begin`, wpe (maxT, C) or undefined, each f32, bf16 or f16 (widened exactly). Tokens
// (B, T) i32. Collective over `group`. With `whole` (--sp, Note [Sequence parallel]): the
// lookup goes to *whole (B, T, C) f32 and its sum over the group is reduce-scattered into out,
// this rank's B T / size() rows (sequence_mine's), whose positions are then added.
void vocab_parallel_embedding_forward(TensorGroup& group, Tensor& out, const Tensor& tokens,
                                      const Tensor& wte, int64_t begin, const Tensor& wpe,
                                      const Tensor* whole = nullptr);

// dwte (+=) rows of the tokens this rank holds, dwpe (+=, undefined: none) every position, from
// dout (B, T, C) f32, tokens in order (the whole kernel's order, so the same bits). Local.
void vocab_parallel_embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout,
                                       const Tensor& tokens, int64_t begin);

}  // namespace memfit
