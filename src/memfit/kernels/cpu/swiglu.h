// SwiGLU, the LLaMA family's MLP activation: down(silu(gate(x)) * up(x)). The gate and up
// projections run as one matmul whose output row is [g (F) | u (F)]; this op turns that row into
// silu(g) * u, silu(g) = g * sigmoid(g) = g / (1 + exp(-g)) (PyTorch's F.silu).
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// gate_up (N..., 2F), out (N..., F) = silu(g) * u. Each f32, bf16 or f16, independently:
// widened, computed in f32 (exp is simd-inl.h's vector exp, on every target), rounded once on
// store. Against the double reference: out within 2e-6 relative + 1e-6 absolute in f32
// (measured 1.7e-7 relative for g in [-12, 12]), plus one rounding to the output type
// (swiglu_test.cpp, swiglu_mixed_test.cpp).
void swiglu_forward(Tensor& out, const Tensor& gate_up);

// dgate_up (=, not +=) (N..., 2F) from dout (N..., F): dg = dout * u * silu'(g),
// du = dout * silu(g), with silu'(g) = s (1 + g (1 - s)), s = sigmoid(g), and 1 - s formed as
// e s (e = exp(-g)) so that it keeps its digits where s is close to 1. Dtypes as the forward;
// dgate_up may alias gate_up when their dtypes match (each element pair is read before it is
// written, by the same thread). Accuracy: within 4e-6 relative + 2e-6 absolute of the double
// reference in f32, plus one rounding to dgate_up's type; the relative error of dg grows only
// near g = -1.28, where silu' crosses zero and 1 + g (1 - s) cancels (as in PyTorch).
// For g < -88 (forward and backward) the exp's argument is capped: e^88 is finite, so nothing
// becomes inf * 0, and silu(g) is then about g * 6e-39 instead of g e^g, below anything that
// matters.
void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);

}  // namespace memfit::kernels
