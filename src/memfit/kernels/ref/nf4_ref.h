// Plain reference of NF4 weights (kernels/cpu/nf4.h, Note [NF4 weights]): bitsandbytes'
// quantize_4bit with double quantization and its dequantization, element by element over the
// whole tensor, which the vector kernels must reproduce bit for bit on every SIMD target; and
// the matmuls with an NF4 weight as "dequantize all of W, then multiply" in double, the ground
// truth of the tiled kernels (quant_matmul.h).
#pragma once

#include <cstdint>

#include "memfit/kernels/cpu/nf4.h"

namespace memfit::kernels::ref {

// w = NF4 of the w.rows * w.cols f32 values x (row-major), double-quantized.
void nf4_quantize(const float* x, Nf4Weight& w);
// out[i] (w.rows * w.cols values) = kNf4Values[code i] * absmax' of i's block, in f32; with
// round_bf16, rounded to bf16 (to nearest even) and kept as f32.
void nf4_dequantize(const Nf4Weight& w, float* out, bool round_bf16 = false);

// out (R, OC) = inp (R, IC) @ W^T with W (OC, IC) = nf4_dequantize(w, round_bf16), in double.
void nf4_matmul_forward(double* out, const double* inp, const Nf4Weight& w, int64_t R,
                        bool round_bf16);
// dinp (R, IC) = dout (R, OC) @ W, W as above, in double.
void nf4_matmul_backward_input(double* dinp, const double* dout, const Nf4Weight& w, int64_t R,
                               bool round_bf16);

}  // namespace memfit::kernels::ref
