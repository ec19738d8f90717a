// Token plus position embedding, the first layer of GPT-2.
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; with wpe undefined (LLaMA: rotary positions
// instead), out[b,t,:] = wte[tokens[b,t],:].
// out (B,T,C) f32; tokens (B,T) i32 with every id < wte rows; wte (V,C); wpe (maxT,C), T <= maxT.
// wte and wpe may each be f32, bf16 or f16 (mixed precision's working copies): widened, added
// in f32. Backward is all f32.
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);

// Accumulates (+=) into dwte and dwpe from dout (B,T,C); dwpe may be undefined (no positions).
void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);

}  // namespace memfit::kernels
