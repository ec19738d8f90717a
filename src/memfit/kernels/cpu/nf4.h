// NF4 weights as QLoRA stores its frozen base model (bitsandbytes' quantize_4bit with
// quant_type="nf4", blocksize 64, compress_statistics=True): 4-bit codes into the 16-value
// NormalFloat code book, one absmax per block of 64 weights, and the absmax values themselves
// quantized to 8 bits ("double quantization"). The format, its byte count and the tile
// dequantization are Note [NF4 weights] (docs/notes/nf4.md); the matmuls that read it are
// quant_matmul.h; the plain reference is kernels/ref/nf4_ref.h.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

inline constexpr int64_t kNf4Block = 64;        // weights sharing one absmax
inline constexpr int64_t kNf4ScaleBlock = 256;  // absmax values sharing one f32 scale

// bitsandbytes' NF4 code book (create_normal_map(0.9677083, use_extra_value=True), published in
// csrc/kernels.cu and the QLoRA paper): code i dequantizes to kNf4Values[i] * absmax.
inline constexpr std::array<float, 16> kNf4Values = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
// The decision thresholds of bitsandbytes' dQuantizeNF4, its float literals (the midpoints of
// neighbouring values, printed in double: 4 of the 15 lie an ulp from the midpoint's own f32
// rounding), ascending: the code of a scaled weight x is the number of thresholds t with x > t
// (a NaN passes none: code 0).
inline constexpr std::array<float, 15> kNf4Thresholds = {
    -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,  0.2035212516784668f,   0.2920137718319893f,   0.3893125355243683f,
    0.5016634166240692f,  0.6427869200706482f,   0.8614784181118011f};

// The code of one scaled weight (the scalar definition every path follows).
inline uint8_t nf4_code(float x) {
  int c = 0;
  for (float t : kNf4Thresholds) c += x > t;
  return static_cast<uint8_t>(c);
}

// Where the parts of a quantized (rows, cols) weight lie in its one buffer. The weight is
// flattened row-major and cut into blocks of 64 (a block may span rows when cols is not a
// multiple of 64; the last one may be partial):
//   codes    ceil(n/2) bytes, element 2i in the high nibble of byte i, 2i+1 in the low nibble
//   qabsmax  one byte per block: the block's absmax, 8-bit (signed dynamic map)
//   scales   one f32 per 256 blocks (4-byte aligned)
//   offset   one f32: the mean absmax, added back after the 8-bit dequantization
struct Nf4Layout {
  int64_t rows = 0, cols = 0;
  int64_t numel = 0, blocks = 0, scale_blocks = 0;
  size_t code_bytes = 0;
  size_t qabsmax_at = 0, scales_at = 0, offset_at = 0;  // byte offsets; codes at 0
  size_t bytes = 0;                                     // the whole buffer
};
Nf4Layout nf4_layout(int64_t rows, int64_t cols);
// Bytes of a quantized (rows, cols) weight: ceil(n/2) + blocks + pad to 4 + 4 * scale_blocks + 4
// (n = rows * cols, blocks = ceil(n/64), scale_blocks = ceil(blocks/256)).
size_t nf4_bytes(int64_t rows, int64_t cols);

// A quantized weight: views of the parts of one buffer of nf4_bytes(rows, cols) bytes (which
// the caller owns, from the pool). Shallow: copies view the same bytes.
struct Nf4Weight {
  int64_t rows = 0, cols = 0;
  uint8_t* codes = nullptr;
  uint8_t* qabsmax = nullptr;
  float* scales = nullptr;
  float* offset = nullptr;

  // Views `storage` (at least nf4_bytes(rows, cols) bytes, 4-byte aligned).
  static Nf4Weight view(void* storage, int64_t rows, int64_t cols);
  // Views a contiguous u8 tensor of at least nf4_bytes(rows, cols) bytes (checked).
  static Nf4Weight view(const Tensor& storage, int64_t rows, int64_t cols);

  int64_t numel() const { return rows * cols; }
  int64_t blocks() const { return (numel() + kNf4Block - 1) / kNf4Block; }
  // Block b's absmax as dequantization uses it: map[qabsmax[b]] * scales[b / 256] + offset,
  // rounded to f32 after the product and after the sum (bitsandbytes' kDequantizeBlockwise, then
  // its separate add of the offset; never one fused multiply-add).
  float block_absmax(int64_t b) const;
};

// Quantization (once, at load) needs the f32 absmax of every block before the second level can
// be formed: a scratch of this many bytes (4 per block), f32, from the caller.
size_t nf4_quantize_scratch_bytes(int64_t rows, int64_t cols);

// w = NF4 of src (rows, cols), f32 or bf16 (widened exactly). absmax_scratch: f32 of at least
// nf4_quantize_scratch_bytes. Bit-identical on every SIMD target and to ref::nf4_quantize.
void nf4_quantize(const Tensor& src, Nf4Weight& w, Tensor& absmax_scratch);

// The same in pieces, for a load that streams a tensor in: nf4_quantize_rows for consecutive
// row ranges (any order), then nf4_quantize_absmax once. `rows` (k, cols), f32 or bf16, holds
// rows [row0, row0 + k) of the weight; row0 * cols must start a block (a multiple of 64) and the
// piece must end at one or at the end of the weight. Their codes go to w, their blocks' f32
// absmax to absmax_scratch (indexed by block of the whole weight).
void nf4_quantize_rows(const Tensor& rows, int64_t row0, Nf4Weight& w, Tensor& absmax_scratch);
// The second level from the f32 absmax of every block: offset = their mean (formed in double,
// rounded once), then absmax - offset in blocks of 256, each with its max |.| as its scale and a
// byte per value (the nearest entry of the signed dynamic map to value * (1/scale)). The scratch
// is left holding absmax - offset.
void nf4_quantize_absmax(Tensor& absmax_scratch, Nf4Weight& w);

// Dequantization: dst (k, cols), f32 or bf16 (nf4 value * block absmax in f32, then rounded to
// nearest even), = rows [row0, row0 + k) of w. Bit-identical on every SIMD target and to
// ref::nf4_dequantize.
void nf4_dequantize_rows(const Nf4Weight& w, int64_t row0, Tensor& dst);

// For the kernels: elements [e0, e0 + n) of the flattened weight to dst (n elements of
// dst_type: f32, bf16, or f32 holding the bf16-rounded value when `round_bf16`), on the calling
// thread. Any start and length.
void nf4_dequantize_n(const Nf4Weight& w, int64_t e0, int64_t n, DType dst_type, void* dst,
                      bool round_bf16 = false);
// The same for the rectangle rows [r0, r1) x columns [c0, c1) of W, written densely (row stride
// c1 - c0) in one dispatch: the input gradient's column tiles (quant_matmul.h).
void nf4_dequantize_tile(const Nf4Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                         DType dst_type, void* dst, bool round_bf16 = false);

}  // namespace memfit::kernels
