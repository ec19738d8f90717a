// Plain causal attention on the CPU: OpenMP over (batch, head), and within a head a few small
// products done by one register-tiled micro-kernel (AVX-512 where the compiler targets it, plain
// loops otherwise) that skips the blocks above the causal diagonal. Per-head products are too
// small for a oneDNN call each to pay off; see the note in attention_bench.cpp for the numbers.
#include "memfit/kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "memfit/kernels/cpu/attention_tile.h"
#include "memfit/kernels/cpu/checks.h"

namespace memfit::kernels {
namespace {

constexpr std::string_view kOp = "attention";
constexpr int64_t kKeyBlock = 32;   // keys per block of the transposed-key buffer
constexpr int64_t kDepthChunk = 128;  // head dims per pass over that buffer

// S[t, j] = alpha * x_t . y_j for every t and the keys j of each 32-key block that starts at
// or before t: the blocks above the diagonal are skipped, the entries past t in the diagonal
// block are computed and left for the caller to overwrite. x (T, hs) and y (T, hs) have row
// strides ldx, ldy; S is (T, T). y's block is transposed into a stack buffer first so that the
// micro-kernel streams it along the keys.
void causal_scores(const float* x, int64_t ldx, const float* y, int64_t ldy, int64_t T,
                   int64_t hs, float alpha, float* S) {
  alignas(64) float yt[kDepthChunk * kKeyBlock];
  for (int64_t j0 = 0; j0 < T; j0 += kKeyBlock) {
    const int nb = static_cast<int>(std::min(kKeyBlock, T - j0));
    const int64_t rows_per_tile = tile::max_rows(nb);
    for (int64_t d0 = 0; d0 < hs; d0 += kDepthChunk) {
      const int64_t dc = std::min(kDepthChunk, hs - d0);
      tile::transpose(y + j0 * ldy + d0, ldy, nb, dc, yt, kKeyBlock);
      for (int64_t t = j0; t < T; t += rows_per_tile) {
        const int rows = static_cast<int>(std::min(rows_per_tile, T - t));
        tile::run(rows, nb, dc, x + t * ldx + d0, ldx, 1, yt, kKeyBlock, S + t * T + j0, T,
                  alpha, d0 > 0);
      }
    }
  }
}

// out (T, hs) (=) P @ X for a lower-triangular P (T, T) (zeros above the diagonal): row tile
// [t0, t0 + rows) needs only the first t0 + rows columns of P.
void lower_times(const float* P, const float* X, int64_t ldx, int64_t T, int64_t hs, float* out,
                 int64_t ldo) {
  for (int64_t n0 = 0; n0 < hs; n0 += tile::kMaxWidth) {
    const int n = static_cast<int>(std::min<int64_t>(tile::kMaxWidth, hs - n0));
    const int64_t rows_per_tile = tile::max_rows(n);
    for (int64_t t0 = 0; t0 < T; t0 += rows_per_tile) {
      const int rows = static_cast<int>(std::min(rows_per_tile, T - t0));
      tile::run(rows, n, t0 + rows, P + t0 * T, T, 1, X + n0, ldx, out + t0 * ldo + n0, ldo, 1.0f,
                false);
    }
  }
}

// out (T, hs) (=) P^T @ X for a lower-triangular P: row j of the result sums rows t >= j.
void lower_transposed_times(const float* P, const float* X, int64_t ldx, int64_t T, int64_t hs,
                            float* out, int64_t ldo) {
  for (int64_t n0 = 0; n0 < hs; n0 += tile::kMaxWidth) {
    const int n = static_cast<int>(std::min<int64_t>(tile::kMaxWidth, hs - n0));
    const int64_t rows_per_tile = tile::max_rows(n);
    for (int64_t j0 = 0; j0 < T; j0 += rows_per_tile) {
      const int rows = static_cast<int>(std::min(rows_per_tile, T - j0));
      // A(i, k) = P[j0 + k, j0 + i]: the micro-kernel walks P down its columns.
      tile::run(rows, n, T - j0, P + j0 * T + j0, 1, T, X + j0 * ldx + n0, ldx,
                out + j0 * ldo + n0, ldo, 1.0f, false);
    }
  }
}

// Row t of S: softmax over [0, t], zeros past t.
void causal_softmax(float* S, int64_t T) {
  for (int64_t t = 0; t < T; ++t) {
    float* row = S + t * T;
    const int64_t n = t + 1;
    const float mx = tile::row_max(row, n);
    const float sum = tile::exp_shift_sum(row, n, mx);
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    std::fill(row + n, row + T, 0.0f);
  }
}

// D (T, T) holds dP; becomes dS = scale * P * (dP - rowsum(P * dP)), zeros past the diagonal.
void causal_softmax_backward(float* D, const float* P, int64_t T, float scale) {
  for (int64_t t = 0; t < T; ++t) {
    float* d = D + t * T;
    const float* p = P + t * T;
    const int64_t n = t + 1;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < n; ++j) dot += p[j] * d[j];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) d[j] = scale * p[j] * (d[j] - dot);
    std::fill(d + n, d + T, 0.0f);
  }
}

struct Dims {
  int64_t B, T, C, NH, hs;
};

Dims check_qkv(const Tensor& qkv, int n_head) {
  const Shape& s = expect_any_shape(qkv, kOp, "qkv");
  MEMFIT_CHECK_SHAPE(s.rank() == 3 && s[2] % 3 == 0, kOp, "qkv must be (B, T, 3C), got {}", s);
  const int64_t C = s[2] / 3;
  MEMFIT_CHECK_SHAPE(n_head > 0 && C % n_head == 0, kOp,
                     "C = {} (qkv {}) is not divisible by n_head = {}", C, s, n_head);
  return {s[0], s[1], C, n_head, C / n_head};
}

int64_t scratch_floats(int64_t T) { return T * T; }

}  // namespace

void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head) {
  const auto [B, T, C, NH, hs] = check_qkv(qkv, n_head);
  expect_tensor(out, kOp, "out", Shape{B, T, C});
  expect_tensor(att, kOp, "att", Shape{B, NH, T, T});
  const float* qkv_p = qkv.data<float>();
  float* out_p = out.data<float>();
  float* att_p = att.data<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t C3 = 3 * C;

#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv_p + b * T * C3 + h * hs;
    float* S = att_p + bh * T * T;
    causal_scores(q, C3, q + C, C3, T, hs, scale, S);
    causal_softmax(S, T);
    lower_times(S, q + 2 * C, C3, T, hs, out_p + b * T * C + h * hs, C);
  }
}

size_t attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t C, int n_head) {
  const int64_t slots = std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), B * n_head));
  return static_cast<size_t>(slots * scratch_floats(T)) * sizeof(float);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                        Tensor& workspace, int n_head) {
  const auto [B, T, C, NH, hs] = check_qkv(qkv, n_head);
  expect_tensor(dqkv, kOp, "dqkv", qkv.shape());
  expect_tensor(dout, kOp, "dout", Shape{B, T, C});
  expect_tensor(att, kOp, "att", Shape{B, NH, T, T});
  expect_any_shape(workspace, kOp, "workspace");
  if (B * NH * T == 0) return;
  // One (T, T) slice per thread; a smaller workspace runs on fewer threads.
  const int64_t slots = workspace.numel() / scratch_floats(T);
  MEMFIT_CHECK_SHAPE(slots >= 1, kOp,
                     "workspace {} holds {} floats, less than one (T, T) = ({}, {}) scratch; "
                     "allocate attention_backward_workspace_bytes() = {} bytes",
                     workspace.shape(), workspace.numel(), T, T,
                     attention_backward_workspace_bytes(B, T, C, n_head));
  const int threads = static_cast<int>(std::min<int64_t>(slots, omp_get_max_threads()));

  const float* qkv_p = qkv.data<float>();
  const float* dout_p = dout.data<float>();
  const float* att_p = att.data<float>();
  float* dqkv_p = dqkv.data<float>();
  float* ws = workspace.data<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t C3 = 3 * C;

#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv_p + b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* dout_bh = dout_p + b * T * C + h * hs;
    const float* P = att_p + bh * T * T;
    float* dq = dqkv_p + b * T * C3 + h * hs;
    float* D = ws + omp_get_thread_num() * scratch_floats(T);
    causal_scores(dout_bh, C, v, C3, T, hs, 1.0f, D);          // dP = dout @ v^T
    causal_softmax_backward(D, P, T, scale);                     // dS, scaled
    lower_times(D, k, C3, T, hs, dq, C3);                        // dq = dS @ k
    lower_transposed_times(D, q, C3, T, hs, dq + C, C3);         // dk = dS^T @ q
    lower_transposed_times(P, dout_bh, C, T, hs, dq + 2 * C, C3);  // dv = P^T @ dout
  }
}

}  // namespace memfit::kernels
