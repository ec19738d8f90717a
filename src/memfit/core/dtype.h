// Element types. f32 and bf16 are computed with now; f16 and block-quantized int8 have their
// place so later precisions and optimizers slot in; i32 holds token ids, u16 token shards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace memfit {

enum class DType : uint8_t { f32, bf16, f16, i8, i32, u16 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::u16; }
template <> constexpr DType dtype_of<int8_t>() { return DType::i8; }

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

}  // namespace memfit
