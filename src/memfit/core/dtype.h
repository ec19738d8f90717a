// Element types. f32 is the master precision; bf16 and f16 (IEEE half) are the mixed-precision
// storage types (see docs/notes/mixed-precision.md); block-quantized int8 has its place so later
// optimizers slot in (and holds int8 activation codes); u8 holds FP8 E4M3 activation codes (Note
// [Activation compression]); i32 holds token ids, u16 token shards. The scalar conversions below are the
// bit-exact definitions the vectorised kernels (kernels/cpu/convert.h) are tested against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace memfit {

enum class DType : uint8_t { f32, bf16, f16, i8, i32, u16, u8 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::u16; }
template <> constexpr DType dtype_of<int8_t>() { return DType::i8; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

// bf16 is the top half of an IEEE float. Conversion rounds to nearest, ties to even; NaN stays
// NaN (quiet), infinities stay infinite.
inline uint16_t bf16_from_f32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float f32_from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits; largest finite 65504, smallest
// subnormal 2^-24). Rounds to nearest, ties to even, through the subnormals; values from 65520
// up (the midpoint to the next power of two) become infinity; NaN stays NaN with the quiet bit
// set and the top mantissa bits kept, as vcvtps2ph does.
inline uint16_t f16_from_f32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520, or inf
  if (a >= 0x38800000u) {  // normal in half (>= 2^-14): rebias the exponent by 127 - 15
    uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: the tie goes to 0
  // Subnormal in half: the value in units of 2^-24 is mant * 2^(e - 126), shifted right.
  const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal
  return static_cast<uint16_t>(sign | q);
}
// Exact (every half is a float). A signalling NaN comes back quiet, as vcvtph2ps does.
inline float f32_from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (e == 0x1fu) {
    u = sign | 0x7f800000u | (mant ? 0x400000u | (mant << 13) : 0u);
  } else if (e != 0) {
    u = sign | ((e + 112u) << 23) | (mant << 13);
  } else {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24f;
    std::memcpy(&u, &v, 4);
    u |= sign;
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace memfit
