// The tensor group's collectives of one training step under --tp (Note [Tensor parallel] in
// docs/notes/tensor-parallel.md, "Collectives in BlockStep"), counted from the step plan: per
// micro-batch the two row-parallel all-reduces of every block's forward (again in every
// recomputed one), the two column-parallel ones of every backward, the embedding's and the LM
// head's d(norm), each B x T x C f32; the loss's statistics per chunk of rows (the row max, R
// floats, and the sums, 2R doubles, exchanged as gathers); and the update's gradient check (2
// doubles), and with key/value heads replicated (tp above n_kv_head) their weights' gradients
// gathered once (a ZeRO 2-3 rank: its shard's part). The run logs what its tensor group covered each step (tensor_comm_bytes), which
// the tests compare with this; the step-time estimate prices the all-reduces as the data
// group's.
#pragma once

#include <cstdint>

#include "memfit/model/step_plan.h"
#include "memfit/plan/run_spec.h"

namespace memfit {

struct TensorCommVolume {
  int64_t all_reduce_bytes = 0, all_reduce_count = 0, gathered_bytes = 0;
};

// Zero without --tp (spec.model.tp 1). `step`: plan_step's for the spec's model and options.
// `data_rank`: the rank in the data group, whose ZeRO shard (stages 2-3) bounds the replicated
// key/value gradients it gathers; every other figure is the same on every rank.
TensorCommVolume tensor_comm_per_step(const RunSpec& spec, const StepPlan& step,
                                      int data_rank = 0);

}  // namespace memfit
