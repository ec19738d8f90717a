// FP8 numerics for `--precision fp8` (Note [FP8], docs/notes/fp8.md): the two OCP formats,
// conversion from f32 and bf16 with a per-tensor scale, and back. One definition of the
// rounding (the scalar functions below), which the vector kernels (fp8.cpp, every SIMD target)
// follow bit for bit and kernels/ref/fp8_ref.h checks by brute force.
//   E4M3 (`float8_e4m3fn`): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; largest finite
//     448, no infinities, S.1111.111 is NaN; subnormals m x 2^-9.
//   E5M2 (`float8_e5m2`): 1 sign, 5 exponent bits (bias 15), 2 mantissa bits; largest finite
//     57344, S.11111.00 is inf, S.11111.{01,10,11} NaN; subnormals m x 2^-16.
// Encoding rounds to nearest, ties to even, and saturates: a value beyond the largest finite
// (infinities included) becomes the largest finite of its sign. That is torchao float8's choice
// (`to_fp8_saturated`: clamp to +-max, then cast), not the plain cast's (which gives NaN for
// E4M3 and inf for E5M2). NaN stays NaN (code sign | 0x7f in both formats). -0 keeps its sign.
// Scaling is torchao's tensorwise "dynamic" (current) recipe: scale = max_finite / amax of the
// tensor being cast, computed from that tensor at the moment it is cast (no amax history), the
// codes are fp8(x * scale) and the value they stand for is fp8 / scale.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

enum class Fp8Format : uint8_t { e4m3, e5m2 };

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
// The smallest amax a scale is computed from (torchao's EPS = 1e-12): an all-zero tensor gets
// scale max / 1e-12 rather than inf.
inline constexpr float kFp8MinAmax = 1e-12f;

inline constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? kE4M3Max : kE5M2Max; }
const char* fp8_format_name(Fp8Format f);  // "e4m3" or "e5m2"

namespace fp8_detail {
// Mantissa bits and exponent bias of a format.
inline constexpr int mbits(Fp8Format f) { return f == Fp8Format::e4m3 ? 3 : 2; }
inline constexpr int bias(Fp8Format f) { return f == Fp8Format::e4m3 ? 7 : 15; }
// The smallest normal, 2^(1 - bias), and the inverse of the subnormal step, 2^(bias - 1 + m).
inline constexpr float min_normal(Fp8Format f) { return f == Fp8Format::e4m3 ? 0x1p-6f : 0x1p-14f; }
inline constexpr float sub_inv_step(Fp8Format f) { return f == Fp8Format::e4m3 ? 0x1p9f : 0x1p16f; }
}  // namespace fp8_detail

// The code of y (already scaled), rounded to nearest even, saturated, NaN kept.
inline uint8_t fp8_encode(Fp8Format f, float y) {
  uint32_t u;
  std::memcpy(&u, &y, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(y)) return static_cast<uint8_t>(sign | 0x7fu);
  const float a = std::fmin(std::fabs(y), fp8_max(f));
  const int m = fp8_detail::mbits(f);
  uint32_t code;
  if (a < fp8_detail::min_normal(f)) {  // subnormal (exact power-of-two scaling, then RNE)
    code = static_cast<uint32_t>(std::nearbyint(a * fp8_detail::sub_inv_step(f)));
  } else {  // rebias the exponent (127 -> bias) and round 23 mantissa bits to m
    uint32_t v;
    std::memcpy(&v, &a, 4);
    const int shift = 23 - m;
    code = ((v + ((1u << (shift - 1)) - 1u) + ((v >> shift) & 1u)) >> shift) -
           (static_cast<uint32_t>(127 - fp8_detail::bias(f)) << m);
  }
  return static_cast<uint8_t>(sign | code);
}

// The value of a code, exact in f32 (and in bf16): +-inf and NaN where the format has them.
inline float fp8_decode(Fp8Format f, uint8_t c) {
  const int m = fp8_detail::mbits(f), b = fp8_detail::bias(f);
  const uint32_t e = (c & 0x7fu) >> m, man = c & ((1u << m) - 1u);
  const uint32_t emax = (1u << (7 - m)) - 1u;
  float a;
  if (f == Fp8Format::e4m3 && (c & 0x7fu) == 0x7fu) {
    a = NAN;
  } else if (f == Fp8Format::e5m2 && e == emax) {
    a = man == 0 ? INFINITY : NAN;
  } else if (e == 0) {
    a = static_cast<float>(man) / fp8_detail::sub_inv_step(f);
  } else {
    const uint32_t bits = ((e + 127u - static_cast<uint32_t>(b)) << 23) | (man << (23 - m));
    std::memcpy(&a, &bits, 4);
  }
  return (c & 0x80u) ? -a : a;
}

// The scale for a tensor whose largest |x| is amax: max_finite / max(amax, 1e-12), in f32
// (torchao's amax_to_scale, without rounding the scale to a power of two). A non-finite amax
// gives a NaN scale (inf: the tensor is not finite; the caller reports it).
float fp8_scale(float amax, Fp8Format f);

// fp8_scale rounded down to a power of two, 2^floor(log2(scale)) (torchao's
// `round_scales_to_power_of_2` option): the scaled values lose at most the top binade's use, and
// every FP8 value divided by the scale is still exact in bf16, so a bf16 GEMM with f32
// accumulation on the descaled operands computes what an FP8 GEMM with the scales applied to its
// f32 accumulator computes. NaN stays NaN.
float fp8_scale_pow2(float amax, Fp8Format f);

// max |x| over x (f32 or bf16, any shape), exact; NaN if x holds a NaN, inf if an inf.
float fp8_amax(const Tensor& x);

// codes (u8, x's element count) = fp8_encode(f, x * scale), the product in f32; x f32 or bf16.
void fp8_quantize(const Tensor& x, float scale, Fp8Format f, Tensor& codes);

// codes = fp8_encode(f, bf16(x) * scale), x f32, bf16(x) its rounding to nearest even: the
// codes fp8_quantize gives on the bf16 copy of x, without the copy. --precision fp8 stores its
// working weights so, from the f32 master weights (Note [FP8], "Storage"): the same codes as
// the cast of the bf16 working weights it replaces.
void fp8_quantize_via_bf16(const Tensor& x, float scale, Fp8Format f, Tensor& codes);
// fp8_amax of the bf16 copy of x (f32), without the copy: bf16(fp8_amax(x)), since rounding to
// nearest is monotone and symmetric. NaN if x holds a NaN.
float fp8_amax_via_bf16(const Tensor& x);

// x (f32 or bf16, codes' element count) = fp8_decode(f, code) * inv_scale, computed in f32 and
// rounded once. inv_scale 1 widens exactly (every FP8 value is a bf16 value).
void fp8_dequantize(const Tensor& codes, Fp8Format f, float inv_scale, Tensor& x);

// out (f32 or bf16, x's element count) = fp8_decode(f, fp8_encode(f, x * scale)) * (1 / scale):
// x cast to FP8 and back in one pass (what fp8_quantize then fp8_dequantize give, bit for bit,
// without the codes). With a power-of-two scale the result is exact in bf16. out may be x.
void fp8_round_trip(const Tensor& x, float scale, Fp8Format f, Tensor& out);

// x cast to FP8 with the current (dynamic) power-of-two scale of its own amax, into out:
// fp8_round_trip(x, fp8_scale_pow2(fp8_amax(x), f), f, out). Returns the scale (NaN where x is
// not finite, and out is then all NaN, so the step's non-finite check sees it).
float fp8_cast_dynamic(const Tensor& x, Fp8Format f, Tensor& out);

}  // namespace memfit::kernels
