// Softmax cross-entropy over the vocabulary, one block of rows at a time. The caller (the
// model's chunked LM head) computes a block of logits, calls this, and uses the block's
// gradient at once, so the full (B*T, V) logits and their gradient never exist.
// See docs/notes/fused-lm-head.md.
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// logits (R, Vp) f32 with only the first V columns real (the rest is padding); targets (R) i32
// in [0, V); losses (R) receives -log softmax(logits)[target] per row.
// Loss masks (docs/data.md, "Loss masks"): with `mask` (R) u8, a row whose mask is 0 is not
// computed: its loss is exactly 0 and, in the overloads below, its gradient row exactly 0
// (padding included), so it adds nothing to any gradient. Rows whose mask is 1 get the same
// bits as without a mask. Null: every row counts.
void crossentropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t V,
                          const Tensor* mask = nullptr);

// As forward, then overwrites logits in place with their gradient:
// dlogits = (softmax(logits) - onehot(target)) * dloss, and 0 in the padded columns. With
// round_to bf16 or f16, each element of the gradient is rounded once to that precision (to
// nearest even) and kept f32: the mixed overload's dlogits widened exactly, without the
// separate tensor (the widened matmuls' operand, matmul_widened.h).
void crossentropy_forward_backward(Tensor& losses, Tensor& logits, const Tensor& targets,
                                   int64_t V, float dloss, DType round_to = DType::f32,
                                   const Tensor* mask = nullptr);

// Mixed precision: the same loss and gradient, the gradient written into dlogits (R, Vp) of
// f32, bf16 or f16, each element the f32 gradient above rounded once to nearest even (padding
// 0). logits stay f32 and serve as scratch: on return they hold exp(logit - row max). With
// loss scaling, dloss carries the scale (scale / (B*T)); an f16 dlogits then overflows to inf
// only if dloss exceeds 65504.
void crossentropy_forward_backward(Tensor& losses, Tensor& dlogits, Tensor& logits,
                                   const Tensor& targets, int64_t V, float dloss,
                                   const Tensor* mask = nullptr);

}  // namespace memfit::kernels
