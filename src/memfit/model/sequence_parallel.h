// Sequence parallelism (--sp with --tp; Korthikanti et al. 2022, Megatron-LM's
// sequence_parallel): between the tensor-parallel linears the residual stream, the norms and
// the other element-wise regions hold 1/T of the micro-batch's tokens on each of the T ranks of
// the tensor group, instead of all of them on every rank. Here is the one place that says which
// rows a rank holds and how the stream moves between the two layouts: an all-gather (each rank's
// rows, in rank order, into the whole (N, C) buffer) before a column-parallel linear, a
// reduce-scatter (the group's sum of a partial (N, C) product, each rank keeping its rows) after a
// row-parallel one; the backward mirrors them. Note [Sequence parallel] in
// docs/notes/tensor-parallel.md.
//
// A rank holds rows [rank n, (rank + 1) n) of the micro-batch's N = B x S tokens flattened in
// (batch, position) order, n = N / T: for one sequence (B = 1) its rank-th slice of the sequence.
// The split is of the flattened rows, so every gather and reduce-scatter moves one contiguous
// piece per rank in place (Megatron gets the same from its [s, b, h] layout); S must divide by T,
// which makes n whole for every batch size.
#pragma once

#include <cstdint>

#include "memfit/core/shape.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/tensor_group.h"

namespace memfit {

class Tensor;

// Whether the step splits the sequence: options.sequence_parallel under --tp above 1 (with one
// tensor rank there is nothing to split, and the flag changes nothing).
bool sequence_parallel(const ModelConfig& config, const ActivationOptions& options);
// The rows of the sequence-sharded regions on one rank: rows / tp under sequence parallelism,
// else rows.
int64_t sequence_rows(const ModelConfig& config, const ActivationOptions& options, int64_t rows);
// Throws ConfigError naming --sp and the values unless the sequence divides by --tp (and the
// step is fp32, bf16 or fp16: fp8 is not built with it).
void check_sequence_parallel(const ModelConfig& config, const ActivationOptions& options,
                             int seq_len);
// The parameters whose gradients are partial on each tensor rank under sequence parallelism:
// the norms' gains and biases, which each rank's backward sees only its rows of. Summed over
// the group once a step (Transformer::reduce_sequence_partials).
bool sequence_partial(ParamRole role);

// The rows of `full` (N, ..., C) contiguous that `group`'s rank holds: a contiguous (N / T, C)
// view.
Tensor sequence_mine(const TensorGroup& group, const Tensor& full);
// full (N, C) f32: every rank's rows of it, already written in place, gathered on every rank.
void sequence_gather(TensorGroup& group, const Tensor& full);
// full = every rank's `mine` (N / T rows, f32) in rank order: copied into its place, gathered.
void sequence_gather_from(TensorGroup& group, const Tensor& mine, const Tensor& full);
// full (N, C) f32 holds this rank's partial sum of the whole: the group's sum of this rank's rows
// lands in sequence_mine(full) (the other rows are left as they were).
void sequence_scatter_sum(TensorGroup& group, const Tensor& full);

}  // namespace memfit
