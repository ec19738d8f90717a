// Conversions between the floating-point storage types and the checks mixed precision needs:
// f32 <-> bf16 / f16 rounding to nearest even (refreshing a BF16 working copy of the weights,
// casting a gradient to a matmul's input type), f32 -> bf16 with stochastic rounding driven by
// a counter-based hash (pure-BF16 weights), a non-finite scan, and the fused "unscale and
// check" of FP16 loss scaling. See docs/notes/mixed-precision.md.
#pragma once

#include <cstdint>
#include <cstring>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// dst = src element by element; each of f32, bf16 or f16, the same element count (shapes may
// differ). Narrowing rounds to nearest, ties to even (subnormals kept, f16 overflow to inf,
// NaN stays NaN, quiet); widening is exact. Bit-identical on every SIMD target. Same dtype:
// a copy of the bits.
void convert(Tensor& dst, const Tensor& src);

// dst (bf16) = src (f32) with stochastic rounding: element i rounds up (away from zero) with
// probability equal to its distance from the bf16 below, so the expected result is src.
// The random bits of element i come from (seed, index0 + i) alone, so the result is the same
// for any thread count and any split of a tensor into pieces given their offsets as index0.
void convert_stochastic(Tensor& dst, const Tensor& src, uint64_t seed, uint64_t index0 = 0);

// True if no element is inf or NaN; f32, bf16 or f16.
bool all_finite(const Tensor& t);

// For FP16 loss scaling: grads (f32) *= inv_scale in place, and in the same pass whether every
// result is finite and their sum of squares (in double, added as kernels::sum_squares adds, so
// it equals sum_squares of the unscaled gradients bit for bit). sum_squares is inf or NaN when
// finite is false.
struct UnscaleResult {
  bool finite;
  double sum_squares;
};
UnscaleResult unscale_and_check(Tensor& grads, float inv_scale);

// For the kernels: dst[i] = src[i] for i < n over raw storage of f32, bf16 or f16, on the
// calling thread, with convert()'s rounding (bit-identical on every SIMD target).
void convert_n(DType src_type, DType dst_type, void* dst, const void* src, int64_t n);
// The same on the OpenMP team (each thread a contiguous part; the same bits), for raw storage
// outside a kernel: the set-up rounding the initial weights into a working copy.
void convert_n_team(DType src_type, DType dst_type, void* dst, const void* src, int64_t n);

// --- Stochastic rounding, element by element (the definition the vector path follows) ---

// 32 random bits for element `index` under `seed`: lowbias32 (a bijective integer mix) of the
// index's low 32 bits xor a key, the key mixing the seed with the index's high 32 bits.
inline uint32_t sr_key(uint64_t seed, uint32_t index_hi) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t{index_hi} + 1);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}
inline uint32_t sr_bits(uint32_t key, uint32_t index_lo) {
  uint32_t x = index_lo ^ key;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
// bf16 of x rounded up in magnitude when the 16 bits below bf16 precision plus the top 16
// random bits carry, down otherwise; NaN stays a quiet NaN, inf stays inf.
inline uint16_t bf16_from_f32_stochastic(float x, uint32_t random) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + (random >> 16)) >> 16);
}

}  // namespace memfit::kernels
