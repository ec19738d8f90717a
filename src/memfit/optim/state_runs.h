// Where a rank's optimizer state lies in the whole model's (Note [Checkpoints across layouts],
// "Optimizer state of every kind" in docs/notes/checkpoints.md). A rank of --tp/--pp holds its
// slices and stage of the parameters (model/layout_map.h: runs of its layout in the whole
// layout); its optimizer's state tensors are laid out over that layout. Element-wise state
// (AdamW's moments) maps as the parameters do. Block-wise state maps block for block where the
// runs are whole blocks of both tensors (8-bit and 4-bit codes and absmaxes; Adam-mini's v of a
// head or a row; APOLLO's and GaLore's per-matrix state, a stage holding whole matrices). Two
// kinds of state are shared by the tensor ranks and map otherwise: 4-bit AdamW's rank-1 row and
// column maxima (each rank's rows map to the whole matrix's rows, its columns to its columns)
// and Adam-mini's v of a row-parallel row (each rank holds the whole row's value: the rank with
// the row's first column writes it, every rank reads it). Anything else that does not map is
// refused, naming the state, the parameter and the elements.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "memfit/model/model_config.h"
#include "memfit/model/tensor_slices.h"
#include "memfit/optim/optimizer.h"

namespace memfit {

// What the runs are for: a save writes each whole state element once (shared values by one
// rank); a load reads every element the rank holds.
enum class StateRunUse : uint8_t { save, load };

// Per whole state spec of `mine` (an optimizer over a rank's layout, any range; its whole state
// specs are the rank's layout's), runs (local, whole, n) of state elements: `local` a position in
// the rank's whole state tensor, `whole` in `whole`'s (the same optimizer over the whole run
// model, tp 1 and every stage). `runs`: layout runs of the rank (whole_layout_runs or
// first_holder_runs, cut to the range: runs_within). Error (with the reason) where the state of
// a run does not map.
std::vector<std::vector<SliceRun>> state_layout_runs(const Optimizer& mine, const Optimizer& whole,
                                                     const std::vector<SliceRun>& runs,
                                                     StateRunUse use);

// Why `optim`'s state cannot be saved or loaded across layouts from a rank of `config` (split by
// --tp and/or a --pp stage; every tensor rank checked), or nothing where it can.
std::optional<std::string> layout_state_refusal(const OptimConfig& optim,
                                                const ModelConfig& config);

}  // namespace memfit
