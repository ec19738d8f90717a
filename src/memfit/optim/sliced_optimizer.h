// Which optimizers step a tensor-parallel rank's slice of the model as they step the whole
// model (Note [Tensor parallel], "Optimizers" in docs/notes/tensor-parallel.md). Under --tp each
// rank's optimizer runs over its own layout (ParamLayout of the split config), whose tensors are
// slices of the whole ones (model/tensor_slices.h). An element-wise optimizer (AdamW with f32 or
// bf16 moments, Lion, SGD) computes each element from that element alone, so a slice is its own
// tensor. Adam-mini (the row-parallel rows' sums of squares) and 4-bit AdamW (its rank-1
// scales' maxima) take what their slices lack from the tensor group inside the update
// (optim/tensor_split.h). Block-wise state (8-bit AdamW and Lion: one absmax per 256 values;
// 4-bit AdamW's first moment: per 128) is the same only where every block of a rank's tensor is
// a block of the whole one: checked here, slice by slice. APOLLO and GaLore project whole
// matrices: over a slice they are another algorithm, and are refused with the reason.
#pragma once

#include <optional>
#include <string>

#include "memfit/model/model_config.h"
#include "memfit/optim/optim_config.h"

namespace memfit {

// Why `optim` cannot step the slices of `config` (finalized, split over config.tp > 1) as one
// process steps the whole model: a sentence naming what differs (for block-wise state the first
// parameter, rank and run whose blocks are not the whole tensor's), or nothing where it can.
std::optional<std::string> sliced_optimizer_refusal(const OptimConfig& optim,
                                                    const ModelConfig& config);

}  // namespace memfit
