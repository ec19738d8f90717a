// f16 matmuls through the f32 GEMM. oneDNN 2.6 has no f16 matmul on the CPU at all (see
// docs/notes/mixed-precision.md, "Matmul: bf16 on AMX, and no f16"), so fp16 training widens
// each f16 operand exactly into f32 scratch, runs the f32 kernel (which accumulates in f32, as
// an f16 GEMM with f32 accumulation would) and rounds an f16 output once, to nearest even.
// The numbers are those of an f16-input, f32-accumulate GEMM; the speed is FP32's, and the
// scratch (Category::workspace, sized by matmul_f16_scratch_bytes) is the price of the route.
// Operands that are already f32 are used in place. Anything but f32/f16 is a DTypeError.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memfit/core/tensor.h"

namespace memfit::kernels {

// Scratch bytes for any forward or backward of an (R, IC) x (OC, IC)^T product with every
// operand f16: the widened input, weight, bias and dout, and an f32 output to round from.
size_t matmul_f16_scratch_bytes(int64_t R, int64_t IC, int64_t OC);

// As matmul_forward: out (f32 or f16) = inp @ weight^T + bias; scratch holds at least
// matmul_f16_scratch_bytes(R, IC, OC) bytes.
void matmul_forward_f16(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                        Tensor& scratch);

// As matmul_backward: dinp (=, f32 or f16, skipped if undefined) = dout @ weight; dweight (f32)
// += dout^T @ inp; dbias (f32, skipped if undefined) += column sums of dout.
void matmul_backward_f16(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                         const Tensor& inp, const Tensor& weight, Tensor& scratch);

}  // namespace memfit::kernels
