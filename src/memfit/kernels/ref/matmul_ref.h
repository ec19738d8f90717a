// Plain double-precision reference for the linear layer and GEMM: the ground truth the fast
// oneDNN kernels are tested against, and a building block of the double-precision GPT-2
// reference. Loops over raw pointers with explicit sizes, written to be obviously right.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// out (R, OC) = inp (R, IC) @ weight^T + bias; weight (OC, IC); bias (OC) or nullptr.
void matmul_forward(double* out, const double* inp, const double* weight, const double* bias,
                    int64_t R, int64_t IC, int64_t OC);

// dinp (R, IC) = dout @ weight (skipped if nullptr); dweight (OC, IC) += dout^T @ inp;
// dbias (OC) += column sums of dout (skipped if nullptr).
void matmul_backward(double* dinp, double* dweight, double* dbias, const double* dout,
                     const double* inp, const double* weight, int64_t R, int64_t IC, int64_t OC);

// C (M, N) = alpha * op(A) @ op(B) + beta * C, row-major with leading dimensions, with the
// meaning of kernels::gemm (A stored (K, M) if trans_a, B stored (N, K) if trans_b). beta = 0
// does not read C.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc);

}  // namespace memfit::kernels::ref
