// Tied embeddings under --pp (Note [Pipeline parallel], "Tied embeddings"), Megatron-LM's way:
// the first stage holds the token table for the embedding, the last stage a copy of it for the
// LM head (ParamLayout; both drawn alike, model/stage_offsets.h). After the backward each holds
// its part of the table's gradient, the embedding's or the head's; this sums them, the first
// stage's plus the last's on both (the same bits on both), so the two apply the same update and
// stay identical. The sum is one process's up to rounding: one process adds the head's and the
// embedding's contributions micro-batch by micro-batch into one accumulator, the stages each
// their own (tests/cli/pipeline_tied_test.cpp states the tolerance).
//
// Where the summed gradients are whole on every data rank (ZeRO 0-1), the exchange is the
// table's between the two ranks of one pipeline group. Where each data rank holds a shard of its
// stage's sums (ZeRO 2-3: Note [Sharded gradients]), the two stages' layouts are cut into shards
// differently, so the first stage's data rank d exchanges with each last-stage data rank d' the
// part of the table both own (tied_shard_pieces), over the world. Either way it goes over point
// to point, a chunk at a time through one receive buffer (Category::comm, "pp.tied"), which the
// planner counts with tied_gradient_buffer_bytes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "memfit/core/element_range.h"
#include "memfit/memory/tensor.h"
#include "memfit/dist/communicator.h"
#include "memfit/dist/process_grid.h"
#include "memfit/memory/pool.h"

namespace memfit::dist {

// The receive buffer's bytes on stage `stage` of `stages` for a table of `table_floats`
// (0 on the stages between, and for an untied model: table_floats 0).
int64_t tied_gradient_buffer_bytes(int stage, int stages, int64_t table_floats);

// One exchange: `count` elements of the summed gradients from element `at` of the tensor sum()
// is given, with rank `peer` of the communicator, which has its own part in the same order.
struct TiedPiece {
  int peer = 0;
  int64_t at = 0, count = 0;
};

// ZeRO 2-3: this rank's pieces, in the order both sides walk them (a first-stage rank by the
// last stage's data ranks, a last-stage rank by the first stage's: no cycle of waits). `first`
// and `last`: each stage's data shards of its layout; `table` and `copy`: the table in the first
// stage's layout and its copy in the last's; `sums_begin`: where this rank's summed gradients
// start in its layout (its shard's begin). Peers are world ranks of `shape` at this rank's
// tensor index.
std::vector<TiedPiece> tied_shard_pieces(std::span<const ElementRange> first,
                                         std::span<const ElementRange> last, ElementRange table,
                                         ElementRange copy, const GridShape& shape,
                                         const GridCoords& me, int64_t sums_begin);

class TiedGradient {
 public:
  // `pipe`: the pipeline group (rank = stage), this rank the first or the last stage; `table`:
  // where the table (first stage) or its copy (last stage) lies in this stage's summed
  // gradients, which are the whole layout (model/stage_offsets.h, tied_table). Allocates the
  // receive buffer from `pool`.
  TiedGradient(Communicator& pipe, ElementRange table, MemoryPool& pool);
  // ZeRO 2-3: the pieces of tied_shard_pieces over `world`, for a table of `table_floats`.
  TiedGradient(Communicator& world, std::vector<TiedPiece> pieces, int64_t table_floats,
               bool first_stage, MemoryPool& pool);
  // The table's gradient in `sums` (this stage's summed gradients: the f32 slab, or the
  // per-unit reduction's accumulator, f32 or with --grad-dtype bf16 bf16, added in f32 and
  // rounded once) becomes the first stage's plus the last stage's, on both.
  void sum(Tensor& sums);

 private:
  Communicator& comm_;
  std::vector<TiedPiece> pieces_;
  const bool first_;
  const int64_t chunk_;  // elements a message
  Allocation buffer_;
};

}  // namespace memfit::dist
