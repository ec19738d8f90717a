// What a rank keeps only its shard of, as three answers, so that code outside state/ (the count
// of a step's collectives in dist/, the options' checks and the search in plan/) asks these
// instead of comparing a ZeRO stage. StatePlacement::sharding computes them, the one place a
// stage is decoded (Note [State placement], docs/notes/state-placement.md). A header of its
// own: dist/comm_volume.h needs the answers, not the placement's layout and options.
#pragma once

namespace memfit {

// Over several ranks (Note [ZeRO]): stage 1 shards the master weights and the optimizer state,
// stage 2 the gradients' sums too, stage 3 the working weights too. With one rank, nothing.
struct StateSharding {
  bool optimizer = false;  // each rank updates its shard of the master weights and state
  bool grads = false;      // the gradients are reduce-scattered: each rank keeps its shard's sums
  bool params = false;     // each rank holds its shard of the working weights, gathered per unit
};

}  // namespace memfit
