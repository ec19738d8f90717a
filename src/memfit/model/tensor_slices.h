// Where a tensor-parallel rank's parameters come from in the whole model (Note [Tensor parallel]
// in docs/notes/tensor-parallel.md): each element of the rank's layout (ParamLayout of a config
// with tp > 1) is one element of the whole layout (the same config at tp 1), or padding (the
// vocabulary rows beyond the whole table, which hold zeros). The initial weights are drawn
// through it, so a rank starts from the whole model's values (the one-process run's), and tests
// compare a rank's weights and gradients with the whole model's through it.
#pragma once

#include <cstdint>
#include <vector>

#include "memfit/core/element_range.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"

namespace memfit {

// `n` elements of the rank's layout from `local` are the whole layout's from `whole` (-1:
// padding, zeros). Runs come in increasing `local` and `whole` order; the alignment gaps of
// either layout are in no run.
struct SliceRun {
  int64_t local = 0, whole = 0, n = 0;
};

// The runs of tensor rank `rank` of config.tp (config finalized and split). Per role: the
// column-parallel weights' (and biases') rows of the rank (GPT-2's c_attn: its q, k and v rows
// each), the row-parallel weights' columns, the embedding's and an untied head's vocabulary
// rows (vocab_shard's), the rest (norms, positions, the row-parallel biases) whole.
std::vector<SliceRun> tensor_slice_runs(const ModelConfig& config, int rank);

// The same config at tp 1: the whole model.
ModelConfig whole_model(const ModelConfig& config);

// Writes the rank's layout elements [range.begin, range.end) into dst from `whole_fill`, which
// writes whole-layout elements [from, to) into its dst (the initial weights' draw); padding and
// gaps 0. `runs`: tensor_slice_runs of this rank.
template <typename WholeFill>
void fill_from_whole(const std::vector<SliceRun>& runs, ElementRange range, float* dst,
                     WholeFill&& whole_fill) {
  for (int64_t i = 0; i < range.size(); ++i) dst[i] = 0.0f;
  for (const SliceRun& r : runs) {
    const int64_t lo = r.local > range.begin ? r.local : range.begin;
    const int64_t hi = r.local + r.n < range.end ? r.local + r.n : range.end;
    if (lo >= hi || r.whole < 0) continue;
    whole_fill(r.whole + (lo - r.local), r.whole + (hi - r.local), dst + (lo - range.begin));
  }
}

}  // namespace memfit
