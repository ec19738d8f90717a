// What the quantized weights' dequantizers (nf4.h, int8_weight.h) check of their arguments, and
// the output form their SIMD code takes, written once for both formats: a range of elements or
// a tile inside the (rows, cols) weight, into f32, bf16, or f32 rounded through bf16 (the
// values a bf16 GEMM multiplies by). `op` names the format's dequantizer in the errors.
#pragma once

#include <cstdint>
#include <string_view>

#include "memfit/core/dtype.h"
#include "memfit/core/error.h"

namespace memfit::kernels {

// The SIMD code's Out: 0 f32, 1 bf16, 2 f32 of bf16 (round_bf16).
inline int dequant_out_form(std::string_view op, DType dst_type, bool round_bf16) {
  MEMFIT_CHECK_DTYPE(dst_type == DType::f32 || dst_type == DType::bf16, op,
                     "dst must be f32 or bf16, got {}", dtype_name(dst_type));
  return dst_type == DType::bf16 ? 1 : round_bf16 ? 2 : 0;
}

// Elements [e0, e0 + n) of a (rows, cols) weight, row-major.
inline void check_dequant_range(std::string_view op, int64_t rows, int64_t cols, int64_t e0,
                                int64_t n) {
  MEMFIT_CHECK_SHAPE(e0 >= 0 && n >= 0 && e0 + n <= rows * cols, op,
                     "elements [{}, {}) lie outside a ({}, {}) weight", e0, e0 + n, rows, cols);
}

// Rows [r0, r1) x columns [c0, c1) of a (rows, cols) weight.
inline void check_dequant_tile(std::string_view op, int64_t rows, int64_t cols, int64_t r0,
                               int64_t r1, int64_t c0, int64_t c1) {
  MEMFIT_CHECK_SHAPE(0 <= r0 && r0 <= r1 && r1 <= rows && 0 <= c0 && c0 <= c1 && c1 <= cols, op,
                     "rows [{}, {}) x columns [{}, {}) lie outside a ({}, {}) weight", r0, r1, c0,
                     c1, rows, cols);
}

}  // namespace memfit::kernels
