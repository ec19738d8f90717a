// Int8 weights as LLM.int8 stores a frozen linear layer (bitsandbytes' Int8Params: CB and SCB),
// the second frozen-base format of LoRA beside NF4 (--base-dtype int8): one signed byte per
// weight and one f32 absmax per row (output channel), "vector-wise" quantization without
// LLM.int8's outlier decomposition (which splits the activations, not the stored weight). The
// format, why per row, and the rounding are Note [Int8 weights] (docs/notes/int8-base.md); the
// tiled matmuls that read it are quant_matmul.h; the plain reference is kernels/ref/int8_ref.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// Codes lie in [-127, 127]; a value dequantizes to code * (absmax * kInt8InvMax), the row's
// scale rounded to f32 once (kInt8InvMax: 1/127 rounded to f32, the constant bitsandbytes'
// int8_vectorwise_dequant multiplies by).
inline constexpr int kInt8CodeMax = 127;
inline constexpr float kInt8InvMax = 7.874015718698502e-3f;

// The code of x in a row whose inverse scale is inv = 127 / absmax (f32): x * inv clamped to
// [-127, 127] (it leaves the range only where 127 / absmax overflowed: a row of subnormals)
// and rounded to nearest, ties to even; NaN (x NaN, or 0 * inf in an all-zero row) gives 0.
// The scalar definition every path follows.
int8_t int8_code(float x, float inv);
// The dequantization scale of a row: absmax * kInt8InvMax in f32.
inline float int8_row_scale(float absmax) { return absmax * kInt8InvMax; }

// Where the parts of a quantized (rows, cols) weight lie in its one buffer:
//   codes   rows * cols signed bytes, row-major
//   absmax  one f32 per row (4-byte aligned after the codes)
struct Int8Layout {
  int64_t rows = 0, cols = 0;
  size_t absmax_at = 0;  // byte offset; codes at 0
  size_t bytes = 0;      // the whole buffer
};
Int8Layout int8_layout(int64_t rows, int64_t cols);
// Bytes of a quantized (rows, cols) weight: rows * cols, padded to 4, + 4 * rows.
size_t int8_bytes(int64_t rows, int64_t cols);

// A quantized weight: views of the parts of one buffer of int8_bytes(rows, cols) bytes (which
// the caller owns, from the pool). Shallow: copies view the same bytes.
struct Int8Weight {
  int64_t rows = 0, cols = 0;
  int8_t* codes = nullptr;
  float* absmax = nullptr;

  // Views `storage` (at least int8_bytes(rows, cols) bytes, 4-byte aligned).
  static Int8Weight view(void* storage, int64_t rows, int64_t cols);
  // Views a contiguous u8 tensor of at least int8_bytes(rows, cols) bytes (checked).
  static Int8Weight view(const Tensor& storage, int64_t rows, int64_t cols);

  int64_t numel() const { return rows * cols; }
};

// Quantization of rows [row0, row0 + k) of w from `rows` (k, cols), f32 or bf16 (widened
// exactly): each row's absmax (its largest |x|, NaN ignored) and its codes. A row needs nothing
// but itself, so a load may stream any pieces of whole rows, in any order, with no scratch.
// Bit-identical on every SIMD target and to ref::int8_quantize.
void int8_quantize_rows(const Tensor& rows, int64_t row0, Int8Weight& w);
// The whole weight: src (rows, cols).
void int8_quantize(const Tensor& src, Int8Weight& w);

// Dequantization: dst (k, cols), f32 or bf16 (code * int8_row_scale(absmax) in f32, then
// rounded to nearest even), = rows [row0, row0 + k) of w. Bit-identical on every SIMD target
// and to ref::int8_dequantize.
void int8_dequantize_rows(const Int8Weight& w, int64_t row0, Tensor& dst);
// For the kernels: elements [e0, e0 + n) of the flattened weight to dst (n elements of
// dst_type: f32, bf16, or f32 holding the bf16-rounded value when `round_bf16`), on the calling
// thread. Any start and length.
void int8_dequantize_n(const Int8Weight& w, int64_t e0, int64_t n, DType dst_type, void* dst,
                       bool round_bf16 = false);
// The same for the rectangle rows [r0, r1) x columns [c0, c1) of W, written densely (row stride
// c1 - c0) in one dispatch: the input gradient's column tiles (quant_matmul.h).
void int8_dequantize_tile(const Int8Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                          DType dst_type, void* dst, bool round_bf16 = false);

}  // namespace memfit::kernels
