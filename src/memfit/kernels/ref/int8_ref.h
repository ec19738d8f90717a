// Plain reference of int8 weights (kernels/cpu/int8_weight.h, Note [Int8 weights]): LLM.int8's
// vector-wise quantization of a weight (bitsandbytes' Int8Params: a row's absmax, its codes
// round(x * 127 / absmax)) and its dequantization, element by element, which the vector kernels
// must reproduce bit for bit on every SIMD target; and the matmuls with an int8 weight as
// "dequantize all of W, then multiply" in double, the ground truth of the tiled kernels
// (quant_matmul.h).
#pragma once

#include <cstdint>

#include "memfit/kernels/cpu/int8_weight.h"

namespace memfit::kernels::ref {

// w = int8 of the w.rows * w.cols f32 values x (row-major).
void int8_quantize(const float* x, Int8Weight& w);
// out[i] (w.rows * w.cols values) = code i * (absmax of its row * kInt8InvMax), in f32; with
// round_bf16, rounded to bf16 (to nearest even) and kept as f32.
void int8_dequantize(const Int8Weight& w, float* out, bool round_bf16 = false);

// out (R, OC) = inp (R, IC) @ W^T with W (OC, IC) = int8_dequantize(w, round_bf16), in double.
void int8_matmul_forward(double* out, const double* inp, const Int8Weight& w, int64_t R,
                         bool round_bf16);
// dinp (R, IC) = dout (R, OC) @ W, W as above, in double.
void int8_matmul_backward_input(double* dinp, const double* dout, const Int8Weight& w, int64_t R,
                                bool round_bf16);

}  // namespace memfit::kernels::ref
