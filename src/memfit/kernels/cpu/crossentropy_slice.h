// The local passes of the vocabulary-parallel cross-entropy: each rank of a tensor group holds
// the logits of a contiguous slice of the vocabulary, and the softmax over the whole row is
// assembled from per-slice statistics that the caller combines across the group between the
// passes (model/vocab_parallel_crossentropy.h issues the collectives; the logits are never
// gathered). The passes are the plain kernel's (crossentropy_rows.h), so a slice that is the
// whole vocabulary gives crossentropy.h's bits. Note [Vocabulary-parallel cross-entropy] in
// docs/notes/tensor-parallel.md.
#pragma once

#include <cstdint>
#include <span>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// This rank's columns: logits column j is vocabulary entry begin + j. Of the slice's `width`
// columns (the logits tensor's), those at vocabulary entries >= vocab (the real vocabulary's
// size) are padding: they never enter the max or the sum, and their gradient is 0.
struct VocabSliceView {
  int64_t begin = 0;  // the first column's vocabulary entry
  int64_t vocab = 0;  // V: the real vocabulary of the whole row, over every slice
};

// Pass 1. row_max (R) = the largest real logit of each row of the slice; -inf where the slice
// has no real column, and for a row whose mask (R u8, may be null) is 0. logits (R, width) f32;
// targets (R) i32 in [0, vocab) (checked here: every rank checks every row).
void crossentropy_slice_max(std::span<float> row_max, const Tensor& logits, const Tensor& targets,
                            VocabSliceView slice, const Tensor* mask = nullptr);

// Pass 2, given the group's max M of each row (row_max, R): sum_exp[r] = sum of exp(x - M[r])
// over the slice's real columns (double), target_logit[r] = the row's target's logit where this
// slice holds it, else 0 (so a sum over the slices is the target's logit). With `store`, the
// real columns of logits become exp(x - M) (for pass 3). Masked rows: 0 and 0, logits untouched.
void crossentropy_slice_sum_exp(std::span<double> sum_exp, std::span<double> target_logit,
                                Tensor& logits, const Tensor& targets,
                                std::span<const float> row_max, VocabSliceView slice, bool store,
                                const Tensor* mask = nullptr);

// Pass 3, given the group's sums (sum_exp, R, over every slice) and after pass 2 with store:
// logits = (softmax - onehot(target)) * dloss in the real columns, 0 in the padding and in every
// column of a masked row; with round_to bf16 or f16 each element rounded once to it (kept f32),
// as crossentropy_forward_backward does.
void crossentropy_slice_backward(Tensor& logits, const Tensor& targets,
                                 std::span<const double> sum_exp, VocabSliceView slice,
                                 float dloss, DType round_to = DType::f32,
                                 const Tensor* mask = nullptr);

// The loss of each row from the group's statistics: log(sum_exp) + row_max - target_logit, as
// the plain kernel computes it (0 for a masked row).
void crossentropy_slice_loss(Tensor& losses, std::span<const float> row_max,
                             std::span<const double> sum_exp, std::span<const double> target_logit,
                             const Tensor* mask = nullptr);

}  // namespace memfit::kernels
