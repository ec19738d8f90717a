// Where a pipeline stage's parameters lie in the whole model (Note [Pipeline parallel], "A
// stage's own parameters" and "Tied embeddings"). A stage's layout is one run of the whole
// layout (ParamLayout::whole_offset), except on the last stage of a tied model, which appends a
// copy of the token table for its LM head: that copy's elements are the table's. What reads a
// stage's parameters by their place in the whole model (the initial draw, pure bf16's
// stochastic rounding, the tied gradients' sum, the clipping norm) asks here.
#pragma once

#include <cstdint>

#include "memfit/core/element_range.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"

namespace memfit {

// The last stage's copy of a tied token table in its layout; empty without one (one stage, an
// untied model, or any other stage). It is the layout's last unit (unit_ranges).
ElementRange tied_table_copy(const ParamLayout& layout);

// The tensor whose gradient the first and last stages of a tied model sum after the backward:
// the first stage's token table, the last stage's copy; empty on every other stage, without
// --pp and for an untied model.
ElementRange tied_table(const ModelConfig& config, const ParamLayout& layout);

// Element `at` of a stage's layout as an element of the whole model's layout: shifted by
// whole_offset(), or in the tied copy the table's own element (the table starts the layout).
int64_t whole_index(const ParamLayout& layout, int64_t at);

// The index among the whole model's parameters (every stage) of the first parameter of
// `config`'s layout: 0 without --pp; what APOLLO draws a stage's projections by
// (Apollo::set_param_index_base).
int64_t first_param_index(const ModelConfig& config);

}  // namespace memfit
