// 4-bit AdamW: the block loops that dequantise, update (the 8-bit AdamW's arithmetic,
// adam_block_apply) and requantise, and for rank-1 second moments the first pass that finds the
// new row and column maxima (its arithmetic, one source for every SIMD target, simd.h, is
// adam_block_apply's for v, operation by operation). Every block goes through the vector code
// whole: a partial block is padded with zeros. See Note [4-bit optimizer].
#include "memfit/kernels/cpu/adamw4bit.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/adamw4bit.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/adamw8bit.h"
#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

// out = the new second moment of n (a multiple of the lane count) values, exactly as
// AdamwApply computes it: fma(b2, v, (1 - b2) (g s)^2).
void SecondMomentApply(const float* g, const float* v, int64_t n,
                       const adamw8bit_detail::AdamCoeffs& c, float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF b2 = hn::Set(d, c.beta2), omb2 = hn::Set(d, c.one_minus_beta2);
  const VF scale = hn::Set(d, c.grad_scale);
  for (int64_t i = 0; i < n; i += N) {
    const VF gi = hn::Mul(hn::LoadU(d, g + i), scale);
    hn::StoreU(hn::MulAdd(b2, hn::LoadU(d, v + i), hn::Mul(omb2, hn::Mul(gi, gi))), d, out + i);
  }
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cstring>
#include <vector>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/quant4.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(SecondMomentApply);

namespace {
using adamw8bit_detail::AdamCoeffs;
constexpr int64_t B = kQuant4Block;

uint8_t* bytes(Tensor& t) { return reinterpret_cast<uint8_t*>(t.data<int8_t>()); }

void check_common(const Tensor& param, const Tensor& grad, const Tensor& m_codes,
                  const Tensor& m_absmax, const Tensor& v_codes, const char* op) {
  expect_any_shape(param, op, "param", DType::f32);
  expect_tensor(grad, op, "grad", param.shape(), DType::f32);
  const int64_t n = param.numel();
  expect_tensor(m_codes, op, "m_codes", {quant4_bytes(n)}, DType::i8);
  expect_tensor(v_codes, op, "v_codes", {quant4_bytes(n)}, DType::i8);
  expect_tensor(m_absmax, op, "m_absmax", {quant4_blocks(n)}, DType::f32);
}

// Block b of [0, n): its f32 values in 128-float buffers (zero past the block's end).
struct BlockBuffers {
  alignas(64) float p[B], g[B], m[B], v[B], s[B];
  int64_t off = 0, nb = 0;

  void load(int64_t b, int64_t n, const float* param, const float* grad) {
    off = b * B;
    nb = std::min(B, n - off);
    std::fill(std::begin(p), std::end(p), 0.0f);
    std::fill(std::begin(g), std::end(g), 0.0f);
    std::fill(std::begin(m), std::end(m), 0.0f);
    std::fill(std::begin(v), std::end(v), 0.0f);
    std::memcpy(p, param + off, static_cast<size_t>(nb) * sizeof(float));
    std::memcpy(g, grad + off, static_cast<size_t>(nb) * sizeof(float));
  }
};

// s[k] = min(rows[i], cols[j]) for the elements off .. off + nb of a (., cols) matrix.
void rank1_scales(const float* rows, const float* cols, int64_t cols_n, int64_t off, int64_t nb,
                  float* s) {
  int64_t i = off / cols_n, j = off % cols_n;
  for (int64_t k = 0; k < nb; ++k) {
    s[k] = std::min(rows[i], cols[j]);
    if (++j == cols_n) j = 0, ++i;
  }
}

}  // namespace

void adamw4bit_update(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax,
                      Tensor& v_codes, Tensor& v_absmax, const AdamWHyper& h, int64_t t,
                      float grad_scale) {
  KernelScope timed("adamw4bit_update");
  const char* op = "adamw4bit";
  check_common(param, grad, m_codes, m_absmax, v_codes, op);
  const int64_t n = param.numel(), blocks = quant4_blocks(n);
  expect_tensor(v_absmax, op, "v_absmax", {blocks}, DType::f32);
  const AdamCoeffs c = adam_block_coeffs(h, t, grad_scale, op);
  float* pp = param.data<float>();
  const float* gp = grad.data<float>();
  uint8_t *mq = bytes(m_codes), *vq = bytes(v_codes);
  float *ma = m_absmax.data<float>(), *va = v_absmax.data<float>();
  const Quant4Map &smap = signed_de4_map(), &umap = unsigned_linear4_map();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    BlockBuffers k;
    k.load(b, n, pp, gp);
    dequantize_block4(mq + k.off / 2, k.nb, ma[b], smap, k.m);
    dequantize_block4(vq + k.off / 2, k.nb, va[b], umap, k.v);
    adam_block_apply(k.p, k.g, k.m, k.v, B, c);
    std::memcpy(pp + k.off, k.p, static_cast<size_t>(k.nb) * sizeof(float));
    ma[b] = quantize_block4(k.m, k.nb, smap, mq + k.off / 2);
    va[b] = quantize_block4(k.v, k.nb, umap, vq + k.off / 2);
  }
}

void adamw4bit_update_rank1(Tensor& param, const Tensor& grad, int64_t rows, int64_t cols,
                            Tensor& m_codes, Tensor& m_absmax, Tensor& v_codes, Tensor& v_rowcol,
                            const AdamWHyper& h, int64_t t, float grad_scale,
                            const RowColMaxima& reduce_maxima) {
  KernelScope timed("adamw4bit_update_rank1");
  const char* op = "adamw4bit_rank1";
  check_common(param, grad, m_codes, m_absmax, v_codes, op);
  const int64_t n = param.numel(), blocks = quant4_blocks(n);
  MEMFIT_CHECK_SHAPE(rows >= 1 && cols >= 1 && rows * cols == n, op,
                     "a ({}, {}) matrix does not hold param {}", rows, cols, param.shape());
  expect_tensor(v_rowcol, op, "v_rowcol", {rows + cols}, DType::f32);
  const AdamCoeffs c = adam_block_coeffs(h, t, grad_scale, op);
  float* pp = param.data<float>();
  const float* gp = grad.data<float>();
  uint8_t *mq = bytes(m_codes), *vq = bytes(v_codes);
  float* ma = m_absmax.data<float>();
  const float* old_rows = v_rowcol.data<float>();
  const float* old_cols = old_rows + rows;
  const Quant4Map &smap = signed_de4_map(), &umap = unsigned_linear4_map();

  // Pass 1: the new second moment's row and column maxima, row by row.
  std::vector<float> next(static_cast<size_t>(rows + cols), 0.0f);
  float* new_rows = next.data();
  float* new_cols = new_rows + rows;
#pragma omp parallel if (n >= kParallelGrain)
  {
    std::vector<float> col_max(static_cast<size_t>(cols), 0.0f);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      float row_max = 0.0f;
      for (int64_t j0 = 0; j0 < cols; j0 += B) {
        const int64_t nk = std::min(B, cols - j0), at = i * cols + j0;
        alignas(64) float g[B] = {}, v[B] = {}, out[B];
        std::memcpy(g, gp + at, static_cast<size_t>(nk) * sizeof(float));
        for (int64_t k = 0; k < nk; ++k)
          v[k] = umap.values[code4_at(vq, at + k)] * std::min(old_rows[i], old_cols[j0 + k]);
        MEMFIT_SIMD_DISPATCH(SecondMomentApply)(g, v, B, c, out);
        for (int64_t k = 0; k < nk; ++k) {
          row_max = std::max(row_max, out[k]);
          col_max[j0 + k] = std::max(col_max[j0 + k], out[k]);
        }
      }
      new_rows[i] = row_max;
    }
    // The maximum does not depend on the order of the merge.
#pragma omp critical(adamw4bit_col_max)
    for (int64_t j = 0; j < cols; ++j) new_cols[j] = std::max(new_cols[j], col_max[j]);
  }

  if (reduce_maxima)
    reduce_maxima(std::span<float>(new_rows, static_cast<size_t>(rows)),
                  std::span<float>(new_cols, static_cast<size_t>(cols)));

  // Pass 2: the update, requantised with the new scales.
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    BlockBuffers k;
    k.load(b, n, pp, gp);
    dequantize_block4(mq + k.off / 2, k.nb, ma[b], smap, k.m);
    rank1_scales(old_rows, old_cols, cols, k.off, k.nb, k.s);
    dequantize_scaled4(vq + k.off / 2, k.s, k.nb, umap, k.v);
    adam_block_apply(k.p, k.g, k.m, k.v, B, c);
    std::memcpy(pp + k.off, k.p, static_cast<size_t>(k.nb) * sizeof(float));
    ma[b] = quantize_block4(k.m, k.nb, smap, mq + k.off / 2);
    rank1_scales(new_rows, new_cols, cols, k.off, k.nb, k.s);
    quantize_scaled4(k.v, k.s, k.nb, umap, vq + k.off / 2);
  }
  std::memcpy(v_rowcol.data<float>(), next.data(), next.size() * sizeof(float));
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
