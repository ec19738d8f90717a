// Brute-force reference of the FP8 casts (kernels/cpu/fp8.h), written from the formats'
// definitions rather than from the encoder's bit tricks: a value's code is the finite code whose
// value is nearest (ties to the even code), searched over every code, so the fast kernels are
// checked against the spec and not against a copy of themselves.
#pragma once

#include <cstdint>

#include "memfit/kernels/cpu/fp8.h"

namespace memfit::kernels::ref {

// The value of code c computed from the spec's formula, (-1)^s 2^(e - bias) (1 + m / 2^M)
// (e > 0) or (-1)^s 2^(1 - bias) m / 2^M (e = 0), with E4M3's S.1111.111 NaN and E5M2's
// S.11111.00 inf, S.11111.xx NaN.
double fp8_value_ref(Fp8Format f, uint8_t c);

// The finite code nearest y (ties to the code whose mantissa is even), |y| beyond the largest
// finite saturating to it, NaN to sign | 0x7f.
uint8_t fp8_encode_ref(Fp8Format f, double y);

// codes[i] = fp8_encode_ref(f, float(x[i] * scale)) (the product rounded to f32 first, as the
// kernel multiplies in f32).
void fp8_quantize_ref(const float* x, int64_t n, float scale, Fp8Format f, uint8_t* codes);

}  // namespace memfit::kernels::ref
