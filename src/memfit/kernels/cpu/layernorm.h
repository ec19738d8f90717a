// LayerNorm over the last dimension (eps 1e-5, as GPT-2), saving mean and 1/std for backward.
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

inline constexpr float kLayerNormEps = 1e-5f;

// inp (N..., C) with R = numel/C rows; out like inp; mean, rstd (R) of f32; weight, bias (C).
// Mixed precision: inp, mean and rstd are always f32; out may be f32, bf16 or f16 (computed in
// f32, rounded once to nearest even); weight and bias each f32, bf16 or f16.
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias);

// The forward's output again, from its saved mean and rstd: the same arithmetic element by
// element, so out is bit-identical to layernorm_forward's on the same input, weight and bias.
// The blocks recompute their LayerNorm outputs in backward with it instead of saving them
// (Note [Recomputed norms], docs/notes/activation-compression.md).
void layernorm_apply(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                     const Tensor& mean, const Tensor& rstd);

// dweight, dbias: accumulate (+=). dinp: ACCUMULATES (+=) too, unlike other activation
// gradients: a LayerNorm input is always a residual stream whose gradient already holds the
// skip path, so adding in place saves a pass over (R, C). All f32 except weight, which may be
// the bf16 / f16 working copy (widened once); dweight and dbias are f32 sums.
void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd);

}  // namespace memfit::kernels
