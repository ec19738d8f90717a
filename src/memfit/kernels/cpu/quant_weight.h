// A frozen weight stored quantized, in either of the formats LoRA's base may take (--base-dtype
// nf4 or int8): one tagged view, and the few operations the base's load, step and save need of
// it, each a switch over the format. What is common to the formats (the tiled matmuls, the
// model's buffer and its streamed quantization, the save and resume) is written once against
// this; what differs (the codes, the scales, the rounding) lives in nf4.h and int8_weight.h.
// Note [Int8 weights] (docs/notes/int8-base.md) and Note [NF4 weights] (docs/notes/nf4.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "memfit/kernels/cpu/int8_weight.h"
#include "memfit/kernels/cpu/nf4.h"
#include "memfit/memory/tensor.h"

namespace memfit::kernels {

enum class WeightQuant : uint8_t { nf4, int8 };
// "nf4", "int8": the names of --base-dtype and of the files and tags that carry the format.
std::string_view weight_quant_name(WeightQuant q);

// One quantized (rows, cols) weight; undefined (no codes) by default.
struct QuantWeight {
  WeightQuant format = WeightQuant::nf4;
  Nf4Weight nf4;
  Int8Weight int8;

  QuantWeight() = default;
  QuantWeight(const Nf4Weight& w) : format(WeightQuant::nf4), nf4(w) {}    // NOLINT: a view
  QuantWeight(const Int8Weight& w) : format(WeightQuant::int8), int8(w) {}  // NOLINT: a view
  // Views `storage` (at least quant_bytes(format, rows, cols) bytes, 4-byte aligned).
  static QuantWeight view(WeightQuant format, void* storage, int64_t rows, int64_t cols);

  bool defined() const;
  int64_t rows() const { return format == WeightQuant::nf4 ? nf4.rows : int8.rows; }
  int64_t cols() const { return format == WeightQuant::nf4 ? nf4.cols : int8.cols; }
};

// Bytes of a quantized (rows, cols) weight (nf4_bytes, int8_bytes).
size_t quant_bytes(WeightQuant format, int64_t rows, int64_t cols);

// Streamed quantization (once, at load): pieces of whole rows, then quant_quantize_finish.
// A piece must start at a multiple of quant_row_step rows (NF4: a block of 64 starts there;
// int8: any row). The f32 scratch the format needs before its last step (NF4: each block's
// absmax, for the second level; int8: none, 0 bytes).
int64_t quant_row_step(WeightQuant format, int64_t cols);
size_t quant_quantize_scratch_bytes(WeightQuant format, int64_t rows, int64_t cols);
void quant_quantize_rows(const Tensor& rows, int64_t row0, QuantWeight& w, Tensor& scratch);
void quant_quantize_finish(Tensor& scratch, QuantWeight& w);
// The whole weight at once: src (rows, cols), f32 or bf16 (nf4_quantize, int8_quantize).
void quant_quantize(const Tensor& src, QuantWeight& w, Tensor& scratch);

// Dequantization, as the format's own functions (nf4_dequantize_n / _tile, int8_...).
void quant_dequantize_n(const QuantWeight& w, int64_t e0, int64_t n, DType dst_type, void* dst,
                        bool round_bf16 = false);
void quant_dequantize_tile(const QuantWeight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                           DType dst_type, void* dst, bool round_bf16 = false);
void quant_dequantize_rows(const QuantWeight& w, int64_t row0, Tensor& dst);

}  // namespace memfit::kernels
