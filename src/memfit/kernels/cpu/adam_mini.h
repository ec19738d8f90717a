// Adam-mini (Zhang et al. 2024, "Adam-mini: Use Fewer Learning Rates To Gain More"): AdamW's
// first moment per parameter, but one second-moment value per block of parameters, the mean of
// g^2 over the block. Which blocks a transformer gets is the optimizer's business
// (optim/adam_mini.h, Note [Adam-mini partition]); this kernel takes equal consecutive blocks.
#pragma once

#include <cstdint>
#include <span>

#include "memfit/memory/tensor.h"
#include "memfit/kernels/cpu/adamw.h"

namespace memfit::kernels {

// One step (t counts from 1) on a flat f32 parameter of n values split into n / block_len
// consecutive blocks; m is f32 (n), v f32 (n / block_len). Per block b:
// v[b] = beta2 v[b] + (1 - beta2) mean(g^2 over b) (the mean accumulated in double), then per
// element as torch.optim.AdamW with v[b] in place of v: p = p (1 - lr wd) - lr/bc1 * m /
// (sqrt(v[b]) / sqrt(bc2) + eps). g is multiplied by grad_scale first. OpenMP over blocks.
void adam_mini_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t block_len,
                      const AdamWHyper& h, int64_t t, float grad_scale = 1.0f);

// The same step in two halves, for blocks whose elements are split over tensor-parallel ranks
// (a row-parallel projection's rows: Note [Tensor parallel], "Optimizers"): first each block's
// sum of (grad_scale g)^2 in double (sums: n / block_len values), which the caller sums over the
// ranks; then the step with mean(g^2 over b) = sums[b] / whole_len (the whole block's elements,
// block_len on every rank summed). With this rank's sums and whole_len = block_len, the two are
// adam_mini_update bit for bit.
void adam_mini_block_sums(const Tensor& grad, int64_t block_len, float grad_scale,
                          std::span<double> sums);
void adam_mini_update_from_sums(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                                int64_t block_len, std::span<const double> sums, int64_t whole_len,
                                const AdamWHyper& h, int64_t t, float grad_scale = 1.0f);

}  // namespace memfit::kernels
