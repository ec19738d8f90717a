// How the parameter layout is cut into pieces that move or are owned together: a ZeRO rank's
// shard and a block's range (Note [Model state], docs/notes/model-state.md). One layout indexes
// every slab (working weights, master weights, gradients) and, through an optimizer's
// state_extents, every optimizer state tensor, so one ElementRange names the same piece of all.
#pragma once

#include <vector>

#include "memfit/model/param_layout.h"
#include "memfit/optim/optim_config.h"
#include "memfit/core/element_range.h"

namespace memfit {

// `world` contiguous ranges tiling [0, layout.total()), rank r's at index r. Each cut is the
// first point at or after r * total / world that the optimizer's state allows (a parameter's
// start; inside a parameter a multiple of 16 elements for element-wise state, of 256 from the
// parameter's start for 8-bit state, an Adam-mini block boundary: Optimizer::next_cut), so
// each rank's optimizer state is exactly the slice of the whole state its range maps to. A
// rank may own an empty range (a tiny model over many ranks). world >= 1.
std::vector<ElementRange> shard_ranges(const ParamLayout& layout, const OptimConfig& optim,
                                       int world);

}  // namespace memfit
