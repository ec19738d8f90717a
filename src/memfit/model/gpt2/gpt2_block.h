// GPT-2's block: x -> LayerNorm -> fused qkv -> causal attention -> projection -> + x, then
// LayerNorm -> 4C linear -> GELU (tanh) -> projection -> +, llm.c's structure on memfit's kernels.
#pragma once

#include "memfit/model/block_step.h"

namespace memfit {

void gpt2_block_forward(BlockStep& s);
void gpt2_block_backward(BlockStep& s);

}  // namespace memfit
