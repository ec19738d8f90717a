// GELU, tanh approximation, as GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include "memfit/core/tensor.h"

namespace memfit::kernels {

// Each tensor f32, bf16 or f16, independently: computed in f32, rounded once on store.
void gelu_forward(Tensor& out, const Tensor& inp);
// dinp (=) = gelu'(inp) * dout. dinp may alias dout when their dtypes match.
void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout);

}  // namespace memfit::kernels
