// 8-bit storage of saved activations (`--act-compress`, Note [Activation compression] in
// docs/notes/activation-compression.md): blocks of 64 consecutive values share one f32 scale,
// and each value is kept as one byte, either
//   int8 (codes i8): q = round(x * 127 / absmax), x' = q * (absmax / 127), or
//   FP8 E4M3 (codes u8): the E4M3 value nearest x * 448 / absmax, x' = e4m3 * (absmax / 448).
// The format follows from the codes' dtype. Unlike the 8-bit optimizers' dynamic map
// (blockwise_quant.h) both are arithmetic, so quantising is a multiply and a rounding per value,
// cheap enough to run on every saved activation of every step.
// Round-trip bounds (per value, A the block's absmax, output in f32; plus half an ulp of the
// output type for bf16 / f16), checked in tests/kernels/act_quant_test.cpp:
//   int8: |x - x'| <= A / 254 + 2^-20 A
//   fp8:  |x - x'| <= 2^-4 |x| + 2^-10 A / 448 + 2^-20 A   (3 mantissa bits; E4M3's subnormals,
//         below 2^-6 A / 448, have a fixed step of 2^-9 A / 448)
// An all-zero block gets scale 0 and comes back zero. A block whose absmax is below 2^-100 is
// scaled as if it were 2^-100 (so 1 / scale stays finite): A reads max(A, 2^-100) above. A block
// holding an inf or NaN gets a NaN scale, so all of it comes back NaN (a non-finite forward
// stays visible).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

inline constexpr int64_t kActBlock = 64;  // values sharing one scale
// Scales needed for n values (the last block may be partial).
inline constexpr int64_t act_blocks(int64_t n) { return (n + kActBlock - 1) / kActBlock; }

inline constexpr float kInt8Max = 127.0f;  // the largest int8 code used (-127..127)
inline constexpr float kFp8Max = 448.0f;   // the largest finite E4M3 value
inline constexpr float kActMinAbsmax = 0x1p-100f;  // the floor of a nonzero block's absmax

// FP8 E4M3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities, S.1111.111 is
// NaN) of y, rounded to nearest, ties to even, for |y| <= 448 (callers clamp). Never NaN.
inline uint8_t fp8_e4m3_from_f32(float y) {
  uint32_t u;
  std::memcpy(&u, &y, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const float a = std::fabs(y);
  uint32_t code;
  if (a < 0x1p-6f) {  // subnormal: steps of 2^-9; 8 x 2^-9 is the smallest normal, code 8
    code = static_cast<uint32_t>(std::nearbyint(a * 512.0f));
  } else {  // rebias the exponent (127 -> 7) and round 23 mantissa bits to 3
    uint32_t v;
    std::memcpy(&v, &a, 4);
    code = ((v + 0x7ffffu + ((v >> 20) & 1u)) >> 20) - (120u << 3);
  }
  return static_cast<uint8_t>(sign | code);
}

// The value of an E4M3 code (exact in f32); the NaN codes 0x7f and 0xff, which the encoder never
// writes, read as +-480.
inline float f32_from_fp8_e4m3(uint8_t c) {
  const uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
  float a;
  if (e == 0) {
    a = static_cast<float>(m) * 0x1p-9f;
  } else {
    const uint32_t bits = ((e + 120u) << 23) | (m << 20);
    std::memcpy(&a, &bits, 4);
  }
  return (c & 0x80u) ? -a : a;
}

// codes = the 8-bit codes of x, scales[b] = the scale of block b (absmax / 127 for i8 codes,
// absmax / 448 for u8 codes). x f32, bf16 or f16, any shape; codes i8 or u8 with x's element
// count; scales f32 with act_blocks(x.numel()) elements. Threaded over blocks; every SIMD target
// gives the bits of kernels/ref/act_quant_ref.h.
void act_quantize(const Tensor& x, Tensor& codes, Tensor& scales);
// x = codes * scale block by block, rounded to x's type (f32, bf16 or f16).
void act_dequantize(const Tensor& codes, const Tensor& scales, Tensor& x);

}  // namespace memfit::kernels
