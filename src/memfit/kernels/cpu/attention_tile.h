// The inner pieces of CPU attention: a register-tiled micro-kernel for the small per-head
// products (with strided A, so it also reads a matrix down its columns) and the vectorised
// row max and exp that softmax needs, dispatched at run time to the SIMD target (simd.h).
#pragma once

#include <cstdint>

namespace memfit::kernels::tile {

// Widest output tile in columns (four 16-float vectors).
inline constexpr int kMaxWidth = 64;

// Rows per tile for an output n columns wide (n <= kMaxWidth): as many as the registers hold.
int64_t max_rows(int n);

// For i < rows, j < n: C[i*ldc + j] (=, or += if accumulate) alpha * sum over k < K of
// A[i*as + k*ak] * B[k*ldb + j]. rows <= max_rows(n), n <= kMaxWidth. B's rows are read n
// floats wide and must be that long; A's element stride may be anything (1 or a row length).
void run(int rows, int n, int64_t K, const float* A, int64_t as, int64_t ak, const float* B,
         int64_t ldb, float* C, int64_t ldc, float alpha, bool accumulate);

// dst[j*ldd + i] = src[i*lds + j] for i < rows, j < cols: a block of keys laid out along the
// keys, so run() can stream it as B. 16 x 16 blocks go through registers.
void transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
               int64_t ldd);

// Largest of x[0, n); n >= 1.
float row_max(const float* x, int64_t n);

// x[i] = exp(x[i] - shift) for i < n; returns their sum. Inputs at or below shift (softmax).
float exp_shift_sum(float* x, int64_t n, float shift);

}  // namespace memfit::kernels::tile
