// Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_: the factor that scales the
// gradients to a total 2-norm of at most max_norm.
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit {

// The 2-norm of the whole gradient slab, computed in double.
double grad_norm(const Tensor& grads);
// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
float clip_factor(double norm, float max_norm);

}  // namespace memfit
