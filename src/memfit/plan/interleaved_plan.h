// The plan of a rank of the interleaved schedule (`--pp-schedule interleaved --pp-virtual V`;
// Note [Pipeline parallel], "Interleaved"): the rank's V chunks, each a model of its virtual
// stage as the trainer makes them (train/train_run_chunks.cpp), added: each chunk's parameters,
// gradients, optimizer state, step arenas and data-group exchange; the loaders' staging once;
// and the runner's kept inputs and transfer buffers over the chunks (dist::pipeline_buffers
// with V); offloaded, each chunk's files, I/O a step and rings (its own directory:
// stage-<virtual stage>/). What `memfit plan` prints per rank and the trainer's pool measures, by category.
#pragma once

#include <cstdint>

#include "memfit/plan/memory_plan.h"
#include "memfit/plan/run_spec.h"

namespace memfit {

// Rank `stage` of spec.pp() (an interleaved run: spec.interleaved()), data rank `data`:
// plan_memory of each chunk's run (spec.stage(c x P + stage)) added as above; with `timed`,
// plan_training's, so flops and the step-time estimate are the chunks' sums (what
// plan_pipeline_time takes as the rank's, with V). The report's model and step plan are chunk
// 0's.
PlanReport plan_interleaved_rank(const RunSpec& spec, int stage, int data, bool timed);

// The parameters rank `stage` holds: its chunks' layouts' elements.
int64_t interleaved_rank_params(const RunSpec& spec, int stage);

}  // namespace memfit
