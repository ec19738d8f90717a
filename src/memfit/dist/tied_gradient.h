// Tied embeddings under --pp (Note [Pipeline parallel], "Tied embeddings"), Megatron-LM's way:
// the first stage holds the token table for the embedding, the last stage a copy of it for the
// LM head (ParamLayout; both drawn alike, model/stage_offsets.h). After the backward each holds
// its part of the table's gradient, the embedding's or the head's; this sums them, the first
// stage's plus the last's on both (the same bits on both), so the two apply the same update and
// stay identical. The sum is one process's up to rounding: one process adds the head's and the
// embedding's contributions micro-batch by micro-batch into one accumulator, the stages each
// their own (tests/cli/pipeline_tied_test.cpp states the tolerance).
//
// The exchange goes over the pipeline group's point to point, a chunk at a time through one
// receive buffer (Category::comm, "pp.tied"), which the planner counts with
// tied_gradient_buffer_bytes.
#pragma once

#include <cstdint>

#include "memfit/core/element_range.h"
#include "memfit/memory/tensor.h"
#include "memfit/dist/communicator.h"
#include "memfit/memory/pool.h"

namespace memfit::dist {

// The receive buffer's bytes on stage `stage` of `stages` for a table of `table_floats`
// (0 on the stages between, and for an untied model: table_floats 0).
int64_t tied_gradient_buffer_bytes(int stage, int stages, int64_t table_floats);

class TiedGradient {
 public:
  // `pipe`: the pipeline group (rank = stage), this rank the first or the last stage; `table`:
  // where the table (first stage) or its copy (last stage) lies in this stage's gradient slab
  // (model/stage_offsets.h, tied_table). Allocates the receive buffer from `pool`.
  TiedGradient(Communicator& pipe, ElementRange table, MemoryPool& pool);
  // The table's gradient in `grads` (this stage's f32 slab) becomes the first stage's plus the
  // last stage's, on both.
  void sum(Tensor& grads);

 private:
  Communicator& pipe_;
  const ElementRange table_;
  const int64_t chunk_;  // floats a message
  Allocation buffer_;
};

}  // namespace memfit::dist
