// The per-row passes of the softmax cross-entropy (crossentropy.cpp), for kernels that run them
// over a part of a row: the vocabulary-parallel cross-entropy (crossentropy_slice.h), whose
// passes must be the plain kernel's, operation for operation, so that one rank holding the whole
// vocabulary gives the plain kernel's bits. Dispatched to the best SIMD target like the kernel.
#pragma once

#include <cstdint>

#include "memfit/core/dtype.h"

namespace memfit::kernels::ce_rows {

// The largest of x[0, n); -inf when n is 0.
float row_max(const float* x, int64_t n);
// The sum of exp(x[i] - mx) over [0, n) (float partial sums of 2048 columns, added in double);
// with `store`, x[i] = exp(x[i] - mx) as well.
double row_sum_exp(float* x, int64_t n, float mx, bool store);
// x[0, n) = x * s (with round_to bf16 or f16: each product rounded once to it, kept f32);
// x[n, width) = 0.
void row_scale_round_pad(DType round_to, float* x, int64_t n, int64_t width, float s);
// round_to's rounding of one value (f32: the value).
float round_one(DType round_to, float v);

}  // namespace memfit::kernels::ce_rows
