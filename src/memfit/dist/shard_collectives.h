// The arithmetic of collectives over ZeRO shards (state/shard.h: one range of the layout per
// rank, in rank order, tiling it): each rank's count, and the all-gather of a buffer laid out
// over the whole layout from its owners. Stage 2's reduce-scatter, stage 3's gathers of one unit,
// stages 1-2's gather of the updated working weights and a save's gather of the weights of
// record all count the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "memfit/dist/communicator.h"
#include "memfit/core/element_range.h"

namespace memfit::dist {

// Each rank's part of `within` (a bucket, a unit), in rank order.
std::vector<int64_t> shard_counts(std::span<const ElementRange> shards, ElementRange within);
// Each rank's whole shard.
std::vector<int64_t> shard_counts(std::span<const ElementRange> shards);

// `whole` (the layout's elements of `elem_bytes` each) gets every rank's shard from its owner;
// `mine` is this rank's shard's elements (they may already be in place in `whole`). Blocking;
// moves bytes, adds nothing.
void all_gather_shards(Communicator& comm, std::span<const ElementRange> shards, const void* mine,
                       void* whole, size_t elem_bytes);

}  // namespace memfit::dist
