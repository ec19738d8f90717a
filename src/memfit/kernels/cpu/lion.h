// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): one momentum and a
// sign update, so half AdamW's state; and its 8-bit variant with the momentum on the signed
// dynamic map (Note [8-bit optimizers]).
#pragma once

#include <cstdint>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

struct LionHyper {
  float lr = 1e-4f;
  float beta1 = 0.9f;   // interpolation for the update's sign
  float beta2 = 0.99f;  // momentum decay
  float weight_decay = 0.0f;
};

// One step on a flat f32 parameter with its gradient and f32 momentum m, all of n values:
// g *= grad_scale; c = beta1 m + (1 - beta1) g; p = p (1 - lr wd) - lr sign(c);
// m = beta2 m + (1 - beta2) g. sign(0) = 0, as torch.sign.
void lion_update(Tensor& param, const Tensor& grad, Tensor& m, const LionHyper& h,
                 float grad_scale = 1.0f);

// The same step with m as 8-bit block state: m_codes i8 (n), m_absmax f32 (quant_blocks(n)).
void lion8bit_update(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax,
                     const LionHyper& h, float grad_scale = 1.0f);

}  // namespace memfit::kernels
