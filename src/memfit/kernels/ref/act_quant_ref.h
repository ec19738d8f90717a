// Plain reference of activation compression (kernels/cpu/act_quant.h): block by block, value by
// value, the arithmetic the vector kernels must reproduce bit for bit on every SIMD target.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// Quantises n floats in blocks of kActBlock: scales[b] = A_b / qmax (A_b the block's absmax,
// raised to 2^-100 when it is below and nonzero; NaN when the block holds an inf or NaN, its
// codes then 0), codes[i] = the int8 (as its byte) or FP8 E4M3 code of clamp(x[i] * qmax / A_b,
// -qmax, qmax), qmax = 127 or 448.
void act_quantize_ref(const float* x, int64_t n, bool fp8, uint8_t* codes, float* scales);
// x[i] = value(codes[i]) * scales[i / kActBlock], in f32.
void act_dequantize_ref(const uint8_t* codes, const float* scales, int64_t n, bool fp8,
                        float* x);

}  // namespace memfit::kernels::ref
