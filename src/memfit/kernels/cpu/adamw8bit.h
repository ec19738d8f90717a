// AdamW with both moments held as block-wise 8-bit state (bitsandbytes' 8-bit Adam): per block
// of 256 values, dequantise m (signed map) and v (unsigned map), update in FP32, move the
// parameters with the FP32 moments, requantise with the block's new absmax. The arithmetic is
// torch.optim.AdamW's. See Note [8-bit optimizers].
#pragma once

#include <cstdint>

#include "memfit/memory/tensor.h"
#include "memfit/kernels/cpu/adamw.h"

namespace memfit::kernels {

namespace adamw8bit_detail {
// Step constants, as torch.optim.AdamW computes them:
// p = p * (1 - lr wd) - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
struct AdamCoeffs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps, decay, grad_scale;
};
}  // namespace adamw8bit_detail

// The quantised AdamWs' shared arithmetic (8-bit here, 4-bit in adamw4bit.h): the step's
// constants (t from 1; `op` names the caller in errors), and the update of n elements with f32
// moments in place, g scaled by grad_scale first:
// m = fma(b1, m, (1-b1) g); v = fma(b2, v, (1-b2) g g);
// p = p decay - step m / (sqrt(v) isb2 + eps).
// Vectorised; every element of a multiple of the lane count goes through the same instructions.
adamw8bit_detail::AdamCoeffs adam_block_coeffs(const AdamWHyper& h, int64_t t, float grad_scale,
                                               const char* op);
void adam_block_apply(float* p, const float* g, float* m, float* v, int64_t n,
                      const adamw8bit_detail::AdamCoeffs& c);

// One step (t counts from 1) on a flat f32 parameter of n values with its gradient; m_codes
// and v_codes are i8 (n), m_absmax and v_absmax f32 (quant_blocks(n)). OpenMP over blocks.
// grad_scale multiplies g first.
void adamw8bit_update(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax,
                      Tensor& v_codes, Tensor& v_absmax, const AdamWHyper& h, int64_t t,
                      float grad_scale = 1.0f);

// The same update on FP32 moments, for the tensors too small to quantise; shares the per-element
// arithmetic with adamw8bit_update.
void adamw8bit_update_f32(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                          const AdamWHyper& h, int64_t t, float grad_scale = 1.0f);

// Pure bf16 weights (no master copy): `param` bf16, each block widened, updated as above and
// stored with stochastic rounding, element i drawing from (seed mixed with t, index0 + i) as
// adamw_update_stochastic draws; the same bits for any split into pieces given their offsets.
void adamw8bit_update_stochastic(Tensor& param, const Tensor& grad, Tensor& m_codes,
                                 Tensor& m_absmax, Tensor& v_codes, Tensor& v_absmax,
                                 const AdamWHyper& h, int64_t t, float grad_scale, uint64_t seed,
                                 uint64_t index0);
void adamw8bit_update_f32_stochastic(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                                     const AdamWHyper& h, int64_t t, float grad_scale,
                                     uint64_t seed, uint64_t index0);

}  // namespace memfit::kernels
