// Linear layers through oneDNN's matmul primitive (oneDNN 2.x API), primitives cached by shape.
// Weights are (OC, IC) as torch.nn.Linear, so out = inp @ weight^T + bias.
#pragma once

#include "memfit/core/tensor.h"

namespace memfit::kernels {

// inp (N..., IC) with R = numel/IC rows; weight (OC, IC); bias (OC) or undefined; out (R..., OC).
void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias);

// dinp (=, skipped if undefined) = dout @ weight; dweight += dout^T @ inp; dbias += sum of dout
// rows (skipped if undefined).
void matmul_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight);

// General C = alpha * op(A) @ op(B) + beta * C on row-major f32 matrices: op(A) is (M, K),
// op(B) is (K, N); `trans_a` / `trans_b` read A as (K, M) / B as (N, K). Used by the kernels
// above and by fused layers (the chunked LM head). beta is 0 or 1.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, const float* B, float beta, float* C);

}  // namespace memfit::kernels
