// The bytes each collective of a training step covers on one rank, by kind: what the plan
// predicts (`memfit plan`: comm_per_step) and the JSON log reports per step (comm_bytes), to
// set against the ZeRO paper's 2Ψ (stages 0-2) and 3Ψ (stage 3). Note [ZeRO].
#pragma once

#include <cstdint>

#include "memfit/state/state_sharding.h"

namespace memfit::dist {

// Bytes of the buffers the collectives of a step cover (the same on every rank). A rank sends
// (W-1)/W of a reduce-scatter's or an all-gather's, twice that of an all-reduce's (its
// reduce-scatter, then its all-gather), as a ring would.
struct CommVolume {
  int64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0;

  CommVolume& operator+=(const CommVolume& o) {
    all_reduce += o.all_reduce;
    reduce_scatter += o.reduce_scatter;
    all_gather += o.all_gather;
    return *this;
  }

  // The elements a rank sends, as multiples of the parameter count at `grad_bytes` per
  // gradient and `param_bytes` per working weight: the paper's "2Ψ" for stages 0 and 2.
  double psi_multiple(int64_t params, int grad_bytes, int param_bytes) const {
    return (2.0 * all_reduce + reduce_scatter) / (double(params) * grad_bytes) +
           double(all_gather) / (double(params) * param_bytes);
  }

  // The bytes a rank sends over `world` ranks, as a ring would: (W-1)/W of each reduce-scatter
  // and all-gather, twice that of an all-reduce. It receives as many.
  double sent_bytes(int world) const {
    if (world <= 1) return 0;
    return (world - 1.0) / world * (2.0 * all_reduce + reduce_scatter + all_gather);
  }
  // What the planner's step-time model prices at the memory-copy rate: every byte sent and
  // every byte received copied once (through a shared-memory segment, the sender copying in and
  // the receiver out; a single-copy transport copies each once, so half this).
  double copied_bytes(int world) const { return 2 * sent_bytes(world); }
  // The sums of the reduced collectives (Note [Deterministic reduction]): each rank adds the W
  // pieces of its 1/W of the buffer, reading the whole buffer's bytes once and writing 1/W.
  double summed_bytes(int world) const {
    if (world <= 1) return 0;
    return double(all_reduce + reduce_scatter) * (1 + 1.0 / world);
  }
};

// A step over `world` ranks with n parameters (f32 gradients, working weights of param_bytes
// each), by what the ranks shard (StatePlacement::sharding): unsharded gradients are
// all-reduced, sharded ones reduce-scattered; where each rank updates its shard of the
// optimizer state, the updated working weights are all-gathered from their owners, unless the
// working weights are sharded too, whose gathers cover `params_gathered` bytes
// (WeightGather::step_gather_bytes: its blocks as the micro-batches need them, the persistent
// units after the update). So stage 0 all-reduces; stage 1 all-reduces, then all-gathers;
// stage 2 reduce-scatters, then all-gathers; stage 3 reduce-scatters and gathers per unit.
// `reductions`: how often the gradients are reduced a step (1, or the micro-batch count where
// every micro-batch is: Note [Sharded gradients]). The loss, the stop flag and the gradient
// norm's partials (a few floats) are not counted. One rank: nothing. `grad_bytes`: 4, or 2
// where the gradients are reduced in bf16 (--grad-dtype bf16).
inline CommVolume step_comm_volume(int64_t n, int param_bytes, int world,
                                   const StateSharding& sharded, int64_t params_gathered = 0,
                                   int reductions = 1, int grad_bytes = 4) {
  CommVolume v;
  if (world <= 1) return v;
  (sharded.grads ? v.reduce_scatter : v.all_reduce) = n * grad_bytes * reductions;
  if (sharded.params)
    v.all_gather = params_gathered;
  else if (sharded.optimizer)
    v.all_gather = n * param_bytes;
  return v;
}

}  // namespace memfit::dist
