// Micro-kernel and softmax helpers for CPU attention. The AVX-512 path keeps a rows x (16*NV)
// tile of C in zmm registers, loads NV vectors of B per k and broadcasts one A element per row;
// the portable path is plain loops with the same meaning, compiled when AVX-512 is not targeted.
#include "memfit/kernels/cpu/attention_tile.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12's own intrinsics (_mm512_max_ps, _mm512_reduce_max_ps, ...) start from a
// self-initialised `__Y = __Y` and warn about it at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace memfit::kernels::tile {

#if defined(__AVX512F__)
namespace {

// Rows per tile by vector count: accumulators + B vectors + one broadcast stay within 32 zmm.
constexpr int kRowsFor[5] = {0, 16, 12, 8, 6};

__mmask16 tail_mask(int n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

template <int R, int NV>
void tile_kernel(int64_t K, const float* A, int64_t as, int64_t ak, const float* B, int64_t ldb,
                 float* C, int64_t ldc, int n, float alpha, bool accumulate) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  const __mmask16 last = tail_mask(n - 16 * (NV - 1));
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV - 1; ++v) bv[v] = _mm512_loadu_ps(b + 16 * v);
    bv[NV - 1] = _mm512_maskz_loadu_ps(last, b + 16 * (NV - 1));
    const float* a = A + k * ak;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * as]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xffff);
      float* c = C + r * ldc + 16 * v;
      __m512 x = _mm512_mul_ps(acc[r][v], al);
      if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, c));
      _mm512_mask_storeu_ps(c, m, x);
    }
  }
}

// Picks the kernel for `rows` (<= kRowsFor[NV]) by walking down from the widest.
template <int NV, int R = kRowsFor[NV]>
void run_rows(int rows, int64_t K, const float* A, int64_t as, int64_t ak, const float* B,
              int64_t ldb, float* C, int64_t ldc, int n, float alpha, bool accumulate) {
  if constexpr (R > 1) {
    if (rows < R)
      return run_rows<NV, R - 1>(rows, K, A, as, ak, B, ldb, C, ldc, n, alpha, accumulate);
  }
  tile_kernel<R, NV>(K, A, as, ak, B, ldb, C, ldc, n, alpha, accumulate);
}

// exp(x) for x <= 0 (and above), as Cephes expf: x = n ln2 + r, |r| <= ln2/2, exp(r) by a
// degree-7 polynomial, 2^n applied by scalef. NaN stays NaN.
__m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.33654f), x);
  x = _mm512_min_ps(_mm512_set1_ps(88.37626f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// dst (16 x 16, row stride ldd) = src^T (row stride lds), in three rounds of shuffles:
// pairs of rows, then groups of four within 128-bit lanes, then lanes across registers.
void transpose16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);      // a0 b0 a1 b1 per lane
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);  // a2 b2 a3 b3
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // r[4i + j]: column 4L + j of rows 4i..4i+3 in lane L
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512 even_lo = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);   // lanes 0, 2
    const __m512 odd_lo = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);    // lanes 1, 3
    const __m512 even_hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    const __m512 odd_hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    _mm512_storeu_ps(dst + (0 + j) * ldd, _mm512_shuffle_f32x4(even_lo, even_hi, 0x88));
    _mm512_storeu_ps(dst + (4 + j) * ldd, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88));
    _mm512_storeu_ps(dst + (8 + j) * ldd, _mm512_shuffle_f32x4(even_lo, even_hi, 0xdd));
    _mm512_storeu_ps(dst + (12 + j) * ldd, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xdd));
  }
}

}  // namespace

int64_t max_rows(int n) { return kRowsFor[std::clamp((n + 15) / 16, 1, 4)]; }

void transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
               int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      if (i0 + 16 <= rows && j0 + 16 <= cols) {
        transpose16(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
        continue;
      }
      for (int64_t i = i0; i < std::min(rows, i0 + 16); ++i)
        for (int64_t j = j0; j < std::min(cols, j0 + 16); ++j) dst[j * ldd + i] = src[i * lds + j];
    }
  }
}

void run(int rows, int n, int64_t K, const float* A, int64_t as, int64_t ak, const float* B,
         int64_t ldb, float* C, int64_t ldc, float alpha, bool accumulate) {
  switch ((n + 15) / 16) {
    case 1: return run_rows<1>(rows, K, A, as, ak, B, ldb, C, ldc, n, alpha, accumulate);
    case 2: return run_rows<2>(rows, K, A, as, ak, B, ldb, C, ldc, n, alpha, accumulate);
    case 3: return run_rows<3>(rows, K, A, as, ak, B, ldb, C, ldc, n, alpha, accumulate);
    default: return run_rows<4>(rows, K, A, as, ak, B, ldb, C, ldc, n, alpha, accumulate);
  }
}

float row_max(const float* x, int64_t n) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = neg_inf;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = tail_mask(static_cast<int>(std::min<int64_t>(16, n - i)));
    m = _mm512_max_ps(m, _mm512_mask_loadu_ps(neg_inf, mask, x + i));
  }
  return _mm512_reduce_max_ps(m);
}

float exp_shift_sum(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = tail_mask(static_cast<int>(std::min<int64_t>(16, n - i)));
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), s));
    _mm512_mask_storeu_ps(x + i, mask, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
  }
  return _mm512_reduce_add_ps(sum);
}

#else  // portable loops

int64_t max_rows(int n) { return 8; }

void run(int rows, int n, int64_t K, const float* A, int64_t as, int64_t ak, const float* B,
         int64_t ldb, float* C, int64_t ldc, float alpha, bool accumulate) {
  for (int i = 0; i < rows; ++i) {
    float acc[kMaxWidth] = {};
    for (int64_t k = 0; k < K; ++k) {
      const float a = A[i * as + k * ak];
      const float* b = B + k * ldb;
      for (int j = 0; j < n; ++j) acc[j] += a * b[j];
    }
    float* c = C + i * ldc;
    for (int j = 0; j < n; ++j) c[j] = alpha * acc[j] + (accumulate ? c[j] : 0.0f);
  }
}

void transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
               int64_t ldd) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
}

float row_max(const float* x, int64_t n) { return *std::max_element(x, x + n); }

float exp_shift_sum(float* x, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

#endif

}  // namespace memfit::kernels::tile
