// Element-wise sums: the residual stream's forward, and accumulation of gradients.
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// out = a + b (same shape). out may alias a or b.
void residual_forward(Tensor& out, const Tensor& a, const Tensor& b);
// dst += src (same element count).
void add_inplace(Tensor& dst, const Tensor& src);
// dst *= s.
void scale_inplace(Tensor& dst, float s);
// Sum of squares in double, for gradient norms.
double sum_squares(const Tensor& t);

}  // namespace memfit::kernels
