// The gradient sums a tensor rank's backward leaves partial (Note [Tensor parallel]): the
// key/value heads replicated on several ranks (--tp above n_kv_head: each replica computed its
// own queries' share) and, with --sp, the norms' gains and biases (each rank saw its rows). Both
// are summed over the tensor group in rank order, in place, over whatever part of the layout a
// buffer holds: the whole slab or a ZeRO shard once a step (Transformer::reduce_kv_replicas,
// reduce_sequence_partials), or one unit's part as its backward ends (--update-in-backward,
// Note [Update in backward], "Under --tp"). Collectives: every rank of the group calls them with
// the same part.
#pragma once

#include "memfit/memory/tensor.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/tensor_group.h"

namespace memfit {

// `sums` (f32, or bf16 widened and rounded back) holds layout elements `have`: each replicated
// key/value weight's part in it becomes the sum of its replicas' parts (a gather over the group,
// then the replicas added in rank order). Nothing where config.kv_replicas() is 1.
void sum_kv_replicas(TensorGroup& group, const ModelConfig& config, const ParamLayout& layout,
                     const Tensor& sums, ElementRange have);
// The same for the sequence-partial parameters (sequence_partial(role)): one all-reduce of each
// part. Call only with --sp.
void sum_sequence_partials(TensorGroup& group, const ParamLayout& layout, const Tensor& sums,
                           ElementRange have);

}  // namespace memfit
