// The LM head's loss when the vocabulary is split across a tensor group: each rank holds the
// logits of a contiguous slice of the vocabulary (its rows of the LM head's weight) and the
// softmax over the whole vocabulary is assembled from per-slice statistics, two collectives of R
// values per block of R rows, so the (R, V) logits are never gathered (Megatron-LM's
// vocab-parallel cross-entropy). With a group of one this is crossentropy.h, bit for bit.
// Note [Vocabulary-parallel cross-entropy] in docs/notes/tensor-parallel.md.
#pragma once

#include <cstdint>

#include "memfit/core/dtype.h"
#include "memfit/model/tensor_group.h"
#include "memfit/model/vocab_shard.h"  // the slices it computes over

namespace memfit {

class Tensor;

// logits (R, width) f32: this rank's slice of each row, column j being vocabulary entry
// shard_begin + j, of a vocabulary of `vocab` real entries (columns at entries >= vocab are
// padding: they enter neither the max nor the sum). targets (R) i32 in [0, vocab); losses (R) =
// -log softmax(whole row)[target], the same on every rank of `group`; mask (R u8, may be null)
// as crossentropy.h's. Collective over `group`: every rank passes the same R.
void vocab_parallel_crossentropy_forward(TensorGroup& group, Tensor& losses, const Tensor& logits,
                                         const Tensor& targets, int64_t shard_begin,
                                         int64_t vocab, const Tensor* mask = nullptr);

// As forward, then overwrites this rank's logits with their gradient: (softmax - onehot(target))
// * dloss in its real columns, 0 in its padding (round_to as crossentropy_forward_backward's).
void vocab_parallel_crossentropy_forward_backward(TensorGroup& group, Tensor& losses,
                                                  Tensor& logits, const Tensor& targets,
                                                  int64_t shard_begin, int64_t vocab, float dloss,
                                                  DType round_to = DType::f32,
                                                  const Tensor* mask = nullptr);

}  // namespace memfit
