// What the quantized weights' dequantizers (nf4.h, int8_weight.h) check of their arguments, the
// output form their SIMD code takes, and their rows-into-a-tensor loop, written once for both
// formats: a range of elements or a tile inside the (rows, cols) weight, into f32, bf16, or f32
// rounded through bf16 (the values a bf16 GEMM multiplies by). `op` names the format's
// dequantizer in the errors.
#pragma once

#include <cstdint>
#include <string_view>

#include "memfit/core/dtype.h"
#include "memfit/core/error.h"
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"
#include "memfit/kernels/kernel_times.h"
#include "memfit/memory/tensor.h"

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

// dst (n, cols) f32 or bf16 = rows [row0, row0 + n) of a (rows, cols) weight, the elements cut
// over the threads, each range through `dequantize_n(e0, count, dtype, out)` (the format's
// *_dequantize_n).
template <class DequantizeN>
void dequantize_rows_into(const char* op, int64_t rows, int64_t cols, int64_t row0, Tensor& dst,
                          DequantizeN&& dequantize_n) {
  KernelScope timed(op);
  const Shape& s = expect_float_any_shape(dst, op, "dst");
  MEMFIT_CHECK_SHAPE(s.rank() == 2 && s[1] == cols && row0 >= 0 && row0 + s[0] <= rows, op,
                     "dst {} from row {} does not fit a ({}, {}) weight", s, row0, rows, cols);
  const DType t = dst.dtype();
  const size_t esize = dtype_size(t);
  auto* out = static_cast<char*>(dst.raw_data());
  const int64_t e0 = row0 * cols;
  simd_ensure_init();
  parallel_ranges(dst.numel(), [&](int64_t begin, int64_t end) {
    dequantize_n(e0 + begin, end - begin, t, out + static_cast<size_t>(begin) * esize);
  });
}

}  // namespace memfit::kernels
