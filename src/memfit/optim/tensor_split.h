// What an optimizer whose state groups elements needs to step a tensor-parallel rank's slices as
// one process steps the whole model (Note [Tensor parallel], "Optimizers" in
// docs/notes/tensor-parallel.md). Adam-mini's second moment of a row-parallel projection's row
// is the mean of the whole row's squares, and 4-bit AdamW's rank-1 scales of a matrix are its
// whole rows' and columns' maxima; a rank holds part of each (its columns, or its rows), so the
// update takes the rest from the tensor group: the rows' sums of squares summed over it, the
// split dimension's maxima maxed over it. optim/ is left of dist/, so the group comes as the
// model's TensorGroup interface (model/tensor_group.h), which train/ hands over (the grid's
// tensor communicator); without one (one process, or --tp 1) the optimizers run as they always
// have, bit for bit.
//
// Every rank of a tensor group holds the same layout shapes and, under ZeRO on the data group,
// the same shard of it (the same cuts), so each update issues the same collectives in the same
// order on every rank of the group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/element_range.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/tensor_group.h"
#include "memfit/optim/optim_config.h"

namespace memfit {

class Optimizer;

// How a rank's parameter is cut from the whole one: whole (replicated: norms, positions, the
// row-parallel biases, key/value heads a rank holds whole), by rows (column-parallel weights and
// biases, the vocabulary-parallel tables: the rank holds some rows whole), or by columns
// (row-parallel weights: the rank holds part of every row).
enum class SliceAxis : uint8_t { whole, rows, columns };

// Per parameter of ParamLayout(config) (split, config.tp > 1), in layout order; all whole at tp 1.
std::vector<SliceAxis> slice_axes(const ModelConfig& config);

struct TensorSplit {
  TensorGroup* group = nullptr;  // the rank's tensor group
  std::vector<SliceAxis> axes;   // slice_axes of the rank's config
  bool active() const { return group != nullptr && group->size() > 1; }
  SliceAxis axis(size_t param_index) const {
    return active() && param_index < axes.size() ? axes[param_index] : SliceAxis::whole;
  }
};

// Whether `optim` (OptimConfig::name) takes a TensorSplit: adam-mini and adamw4bit.
bool takes_tensor_split(const std::string& optim);

// Hands `split` to an optimizer whose update groups elements across the slices (Adam-mini,
// 4-bit AdamW); the element-wise ones and the 8-bit ones (whose blocks the refusal checked are
// whole blocks of the whole tensors) need nothing and are left as they are.
void set_tensor_split(Optimizer& opt, TensorSplit split);

// The bytes one step's update over `range` (the data rank's optimizer range) gives the tensor
// group's gathers (CommunicatorTensorGroup's `gathered`): Adam-mini a double per row of each
// row-parallel matrix in the range, 4-bit AdamW a float per maximum of each quantised matrix's
// split dimension (its columns' where cut by rows, its rows' where cut by columns). 0 for the
// other optimizers and at tp 1. What plan/tensor_comm counts.
int64_t tensor_split_gathered_bytes(const OptimConfig& optim, const ModelConfig& config,
                                    ElementRange range);

}  // namespace memfit
