// Double-precision reference of the residual sum and the element-wise helpers beside it.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// out = a + b over n elements.
void residual_forward_ref(double* out, const double* a, const double* b, int64_t n);
// da += dout, db += dout: both branches of a residual receive the stream's gradient. These
// accumulate (as llm.c's residual_backward) because in the model the gradient of a residual
// input is always a stream that other paths add into as well.
void residual_backward_ref(double* da, double* db, const double* dout, int64_t n);
// dst += src.
void add_inplace_ref(double* dst, const double* src, int64_t n);
// dst *= s.
void scale_inplace_ref(double* dst, double s, int64_t n);
// Sum of squares.
double sum_squares_ref(const double* x, int64_t n);

}  // namespace memfit::kernels::ref
