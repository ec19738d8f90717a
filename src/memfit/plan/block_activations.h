// What each block keeps for its backward: the bytes of its own saved buffers ("h.<l>.*" in the
// step plan, category activations), per block and, for one block, per buffer. The figure to set
// beside the literature's activation memory per layer (Korthikanti et al. 2022: Note [Activation
// memory] in docs/notes/activation-memory.md): `memfit plan --json` prints it as
// "block_activations". Each buffer counts its elements times its type's size, not its room in
// the arena (at most 63 bytes more: the pool's alignment); buffers shared by all blocks (the
// recomputation slots "rc.*", the workspace) are no block's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "memfit/model/step_plan.h"

namespace memfit {

struct BlockActivations {
  std::vector<int64_t> per_block;  // one per block of the plan's model, in order
  // The buffers of the first block that keeps its activations (the first block with the most
  // bytes), by name without the "h.<l>." prefix ("qkv", "fch", "ln_1.mean", "residual_3");
  // `layer` is that block.
  int layer = 0;
  std::map<std::string, int64_t> buffers;
};

// From plan_step's plan for a model of n_layer blocks.
BlockActivations block_activations(const StepPlan& plan, int n_layer);

}  // namespace memfit
