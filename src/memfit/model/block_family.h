// A family's block: its forward (run again as recomputation) and its backward, each one phase
// of one block (Note [One step description]). The skeleton (transformer_step.h) runs the rest of
// the step (embedding, final norm, LM head, recomputation order) the same for every family.
#pragma once

#include "memfit/model/block_step.h"

namespace memfit {

struct BlockFamily {
  // Writes the block's saved activations and its output from its input.
  void (*forward)(BlockStep& s);
  // Accumulates (+=) the block's parameter gradients into s.g and turns ws.dresidual, the
  // gradient of its output, into the gradient of its input, in place.
  void (*backward)(BlockStep& s);
};

const BlockFamily& block_family(Family family);

}  // namespace memfit
