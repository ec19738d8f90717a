// Where each element of a rank's parameter layout lies in the whole model's layout (tp 1, every
// pipeline stage): the coordinates checkpoints are written and read in, so that a save at any
// tp x pp layout (with ZeRO on the data group) loads at any other. Composes the tensor slices
// (model/tensor_slices.h) with a pipeline stage's offset (ParamLayout::whole_offset). Note
// [Checkpoints across layouts] in docs/notes/checkpoints.md.
#pragma once

#include <vector>

#include "memfit/core/element_range.h"
#include "memfit/model/model_config.h"
#include "memfit/model/tensor_slices.h"

namespace memfit {

// The model one process trains: `config` at tp 1 and every stage.
ModelConfig whole_run_model(const ModelConfig& config);

// Whether a rank of `config` holds less than the whole run model, or holds it differently
// (tensor slices, a pipeline stage): its checkpoints then go through the layout map.
bool layout_split(const ModelConfig& config);

// Tensor rank `rank`'s layout (`config` as the rank holds it: its tp and its stage) in the
// whole run model's layout: runs in increasing local order, `whole` -1 for the vocabulary rows
// --tp pads with (rows that are not rows of the whole table). Alignment gaps are in no run.
std::vector<SliceRun> whole_layout_runs(const ModelConfig& config, int rank);

// The runs of whole_layout_runs(config, rank) less the whole elements a lower tensor rank holds
// too (the replicated parameters, the key/value heads replicated where n_kv_head < tp): each
// whole element is written by one tensor rank, the first that holds it.
std::vector<SliceRun> first_holder_runs(const ModelConfig& config, int rank);

// The parts of `runs` whose local elements lie in `range` (runs cut at its edges), padding
// runs (whole -1) dropped.
std::vector<SliceRun> runs_within(const std::vector<SliceRun>& runs, ElementRange range);

}  // namespace memfit
