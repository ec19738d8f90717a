// Plain SGD: no state, for comparisons and for the smallest memory footprint. Momentum is not
// implemented (OptimConfig::beta1 is ignored): p = p - lr (g + wd p), which for momentum-free
// SGD is the same as decoupled decay, p (1 - lr wd) - lr g.
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// One step on a flat f32 parameter and its gradient; g is multiplied by grad_scale first.
void sgd_update(Tensor& param, const Tensor& grad, float lr, float weight_decay,
                float grad_scale = 1.0f);

}  // namespace memfit::kernels
