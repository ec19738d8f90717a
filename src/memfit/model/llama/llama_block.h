// The LLaMA family's block, as Hugging Face's LlamaDecoderLayer: x -> RMSNorm -> q|k|v (one
// matmul over the adjacent q_proj, k_proj, v_proj) -> rotary positions on q and k -> causal
// grouped-query attention -> o_proj -> + x, then RMSNorm -> gate|up (one matmul) -> SwiGLU ->
// down_proj -> +. No biases.
#pragma once

#include "memfit/model/block_step.h"

namespace memfit {

void llama_block_forward(BlockStep& s);
void llama_block_backward(BlockStep& s);

}  // namespace memfit
