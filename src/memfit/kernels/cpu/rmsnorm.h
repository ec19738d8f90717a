// RMSNorm over the last dimension, as Hugging Face's LlamaRMSNorm: the LLaMA family's norm, a
// LayerNorm without the mean and the bias. Saves 1/rms per row for backward.
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// inp (R..., C) with R = numel/C rows; out like inp; rstd (R values, any shape) of f32;
// weight (C). out = weight * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), computed in f32 in
// that order (the normalised row first, then the weight, as LlamaRMSNorm does in f32); the mean
// of squares is summed in float vectors and finished in double. Llama checkpoints give eps as
// rms_norm_eps (1e-5 or 1e-6).
// Mixed precision: inp and rstd are always f32; out may be f32, bf16 or f16 (computed in f32,
// rounded once to nearest even); weight f32, bf16 or f16 (widened once per call).
// Accuracy against the double reference: out within 1e-5 relative + 2e-6 absolute, rstd within
// 2e-6 relative (rmsnorm_test.cpp).
void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                     float eps);

// The forward's output again from its saved rstd, element for element the same arithmetic, so
// bit-identical to rmsnorm_forward's on the same input and weight (Note [Recomputed norms]).
void rmsnorm_apply(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& rstd);

// dweight: accumulates (+=, f32 sums). dinp: ACCUMULATES (+=) too, as in layernorm_backward: an
// RMSNorm input is always a residual stream whose gradient already holds the skip path.
// dinp += rstd * (w*dout - n * mean(w*dout*n)) with n = x * rstd; dweight += sum over rows of
// dout * n. All f32 except weight, which may be the bf16 / f16 working copy (widened once).
// Rows are split over threads; dweight goes through per-thread partials added in thread order,
// so results do not depend on scheduling.
void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd);

}  // namespace memfit::kernels
