// Linear layers through oneDNN's matmul primitive (oneDNN 2.x API), primitives cached by shape.
// Weights are (OC, IC) as torch.nn.Linear, so out = inp @ weight^T + bias.
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// inp (N..., IC) with R = numel/IC rows; weight (OC, IC); bias (OC) or undefined; out (N..., OC).
// dtypes (see docs/notes/mixed-precision.md):
//   inp, weight f32  -> out f32, bias f32: the FP32 path;
//   inp, weight bf16 -> out f32 or bf16 (the out tensor's dtype), bias f32 or bf16; products
//                       accumulate in f32 (AMX on Sapphire Rapids) and out rounds once at the end.
// f16 operands are a DTypeError: oneDNN 2.6 has no f16 matmul on the CPU.
void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias);

// dinp (=, skipped if undefined) = dout @ weight; dweight (+=, skipped if undefined) = dout^T @
// inp; dbias += sum of dout rows (skipped if undefined). dtypes:
//   dout, inp, weight f32  -> dinp f32, dweight f32, dbias f32: the FP32 path;
//   dout, inp, weight bf16 -> dinp f32 or bf16 (its tensor's dtype), dweight f32 (accumulated
//                             in f32 by oneDNN's sum post-op), dbias f32 (f32 column sums).
// A gradient held in f32 (the residual stream's) is converted to bf16 first (convert.h).
void matmul_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight);

// General C = alpha * op(A) @ op(B) + beta * C on row-major f32 matrices: op(A) is (M, K),
// op(B) is (K, N); `trans_a` / `trans_b` read A as (K, M) / B as (N, K). Used by the kernels
// above and by fused layers (the chunked LM head). beta 0 overwrites C (it is not read);
// beta 1 accumulates into it. Operands are dense: each row as stored is followed by the next.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, const float* B, float beta, float* C);

// The same with explicit leading dimensions (row strides, in elements, of A, B and C as
// stored), for strided operands such as one head's q, k or v inside a (B, T, 3C) buffer
// (lda = 3C). Each must be at least the stored row length. No copies are made.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

}  // namespace memfit::kernels
