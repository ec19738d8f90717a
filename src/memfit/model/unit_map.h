// Which unit of a layout (unit_ranges in model/param_layout.h) holds what. The whole model's
// units are the embeddings, block 0, ..., block L-1 and the tail (the final norm and an untied
// head), so unit 1 + l is block l; a pipeline stage's layout (Note [Pipeline parallel], "A
// stage's own parameters") holds its own blocks alone, the embeddings only on the first stage,
// the tail only on the last, and a tied model's last stage a copy of the token table after the
// tail. What reduces or gathers a layout's units by the step's parts (ZeRO's per-unit
// gradients and stage 3's gathers: dist/zero/) asks here instead of counting from unit 1.
#pragma once

#include <cstddef>
#include <vector>

#include "memfit/core/element_range.h"
#include "memfit/model/param_layout.h"

namespace memfit {

struct UnitMap {
  std::vector<ElementRange> units;  // unit_ranges(layout)
  std::vector<int> layer;           // per unit: its block's index in the whole model, or -1
  int embeddings = -1;              // the unit of the embeddings (-1: not in this layout)
  int tail = -1;                    // of the final norm and an untied head
  int copy = -1;                    // of a tied last stage's copy of the token table
  int first_block = -1, first_layer = 0, blocks = 0;  // the layout's blocks, in order

  bool has_block(int l) const { return l >= first_layer && l < first_layer + blocks; }
  // The unit of block `l` (whole-model index); throws for a block the layout does not hold.
  size_t block_unit(int l) const;
  // Whether unit u is an edge unit (the embeddings, the tail, the copy): not a block.
  bool edge(size_t u) const { return layer[u] < 0; }
};

UnitMap unit_map(const ParamLayout& layout);

}  // namespace memfit
