// Which optimizers step a tensor-parallel rank's slice of the model as they step the whole
// model (Note [Tensor parallel], "Optimizers" in docs/notes/tensor-parallel.md). Under --tp each
// rank's optimizer runs over its own layout (ParamLayout of the split config), whose tensors are
// slices of the whole ones (model/tensor_slices.h). An element-wise optimizer (AdamW with f32 or
// bf16 moments, Lion, SGD) computes each element from that element alone, so a slice is its own
// tensor. Block-wise state (8-bit AdamW and Lion: one absmax per 256 values) is the same only
// where every block of a rank's tensor is a block of the whole one: checked here, slice by
// slice. The rest group elements across the slices (4-bit AdamW's rank-1 second moment: a whole
// matrix's row and column maxima; Adam-mini: one second moment per row of the row-parallel
// projections, whose columns are split) or project whole matrices (APOLLO, GaLore): over a
// slice they are another algorithm, and are refused with the reason.
#pragma once

#include <optional>
#include <string>

#include "memfit/model/model_config.h"
#include "memfit/optim/optim_config.h"

namespace memfit {

// Why `optim` cannot step the slices of `config` (finalized, split over config.tp > 1) as one
// process steps the whole model: a sentence naming what differs (for 8-bit state the first
// parameter, rank and run whose blocks are not the whole tensor's), or nothing where it can.
std::optional<std::string> sliced_optimizer_refusal(const OptimConfig& optim,
                                                    const ModelConfig& config);

}  // namespace memfit
