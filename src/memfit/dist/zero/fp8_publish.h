// ZeRO stages 1-2 with --precision fp8's stored working weights (Note [FP8], "Storage"): every
// rank holds the whole working copy (the compact bf16 slab and the blocks' linears as E4M3 codes
// with a scale per matrix) but only its shard of the master weights, so after the update each
// owner writes its range and the ranks exchange them. A matrix's scale is its whole amax, and
// a shard may cut a matrix: the ranks first agree on every matrix's amax (one all-gather of each
// rank's part amaxes, combined by max: the whole matrix's, so the scale is one process's), then
// each encodes its range and the codes are all-gathered at one byte a weight (half the bf16
// gather's bytes for the linears). The codes, the scales and the slab are then those of one
// process holding the same master weights, bit for bit.
#pragma once

#include <cstdint>
#include <span>

#include "memfit/dist/communicator.h"
#include "memfit/model/transformer.h"
#include "memfit/core/element_range.h"

namespace memfit {

// The working copy refreshed from this rank's master weights (shards[comm.rank()], the model's
// master range) and every rank's range gathered from its owner, with the scales agreed. Every
// rank calls it at the same point. Returns the bytes the weights' all-gathers covered
// (fp8_publish_bytes).
int64_t publish_fp8_weights(Transformer& gpt, dist::Communicator& comm,
                            std::span<const ElementRange> shards);

// What publish_fp8_weights gathers a step, the same on every rank: each parameter of the compact
// slab in the working dtype `working`, each block linear weight as one byte. (The amaxes, one
// float per matrix from each rank, are not counted, as the gradient norm's partials are not.)
int64_t fp8_publish_bytes(const ParamLayout& layout, DType working);

}  // namespace memfit
