// Reference linear layer and GEMM in double precision: straightforward loops, no tricks.
#include "memfit/kernels/ref/matmul_ref.h"

namespace memfit::kernels::ref {

void matmul_forward(double* out, const double* inp, const double* weight, const double* bias,
                    int64_t R, int64_t IC, int64_t OC) {
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t o = 0; o < OC; ++o) {
      double sum = bias ? bias[o] : 0.0;
      for (int64_t i = 0; i < IC; ++i) sum += inp[r * IC + i] * weight[o * IC + i];
      out[r * OC + o] = sum;
    }
  }
}

void matmul_backward(double* dinp, double* dweight, double* dbias, const double* dout,
                     const double* inp, const double* weight, int64_t R, int64_t IC, int64_t OC) {
  if (dinp) {
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t i = 0; i < IC; ++i) {
        double sum = 0.0;
        for (int64_t o = 0; o < OC; ++o) sum += dout[r * OC + o] * weight[o * IC + i];
        dinp[r * IC + i] = sum;
      }
    }
  }
  for (int64_t o = 0; o < OC; ++o) {
    for (int64_t i = 0; i < IC; ++i) {
      double sum = 0.0;
      for (int64_t r = 0; r < R; ++r) sum += dout[r * OC + o] * inp[r * IC + i];
      dweight[o * IC + i] += sum;
    }
  }
  if (dbias) {
    for (int64_t o = 0; o < OC; ++o) {
      double sum = 0.0;
      for (int64_t r = 0; r < R; ++r) sum += dout[r * OC + o];
      dbias[o] += sum;
    }
  }
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        double a = trans_a ? A[k * lda + m] : A[m * lda + k];
        double b = trans_b ? B[n * ldb + k] : B[k * ldb + n];
        sum += a * b;
      }
      double& c = C[m * ldc + n];
      c = alpha * sum + (beta != 0.0 ? beta * c : 0.0);
    }
  }
}

}  // namespace memfit::kernels::ref
