// Plain scalar references of the 4-bit optimizer state (kernels/cpu/quant4.h) and the 4-bit
// AdamW step (kernels/cpu/adamw4bit.h), for the fast kernels' tests: one value at a time, in
// float with std::fma where the vector code fuses, so that on a target with FMA the fast
// kernels reproduce them bit for bit (codes included).
#pragma once

#include <cstdint>

#include "memfit/kernels/cpu/adamw.h"
#include "memfit/kernels/cpu/quant4.h"

namespace memfit::kernels::ref {

// Codes of x[i] * (1 / absmax) (absmax = max |x|), packed two a byte; returns absmax.
float quantize_block4_ref(const float* x, int64_t n, const Quant4Map& map, uint8_t* packed);
// Codes of x[i] / s[i] (0 where s[i] is 0), packed two a byte.
void quantize_scaled4_ref(const float* x, const float* s, int64_t n, const Quant4Map& map,
                          uint8_t* packed);

// One 4-bit AdamW step on n values: m block-wise (m_absmax per 128), v block-wise (v_scale: an
// absmax per 128) or, when rows > 0, rank-1 over a (rows, n / rows) matrix (v_scale: the row
// maxima, then the column maxima).
void adamw4bit_update_ref(float* p, const float* g, int64_t n, int64_t rows, uint8_t* m_codes,
                          float* m_absmax, uint8_t* v_codes, float* v_scale, const AdamWHyper& h,
                          int64_t t, float grad_scale);

}  // namespace memfit::kernels::ref
