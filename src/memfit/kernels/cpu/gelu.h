// GELU, tanh approximation, as GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// Each tensor f32, bf16 or f16, independently: computed in f32, rounded once on store.
void gelu_forward(Tensor& out, const Tensor& inp);
// dinp (=) = gelu'(inp) * dout. dinp may alias dout when their dtypes match.
void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout);
// Both in one pass, for a backward that recomputes the GELU it did not keep: out = gelu(inp)
// and dinout = gelu'(inp) * dinout, one tanh per element; the same bits as gelu_forward(out,
// inp) then gelu_backward(dinout, inp, dinout).
void gelu_recompute_backward(Tensor& out, Tensor& dinout, const Tensor& inp);

}  // namespace memfit::kernels
