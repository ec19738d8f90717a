// Flash attention tile operations (see flash_attention_tiles.h): AVX-512 (and AVX512_BF16)
// where the build targets it (-DMEMFIT_NATIVE=ON on this machine), plain loops that the
// compiler may vectorise otherwise. Both paths compute the same thing; tests run whichever the
// build has. The AMX products are in flash_attention_amx.cpp.
#include "memfit/kernels/cpu/flash_attention_tiles.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__AVX512F__)
// GCC 12 reports the _mm512_undefined_* placeholders inside unmasked intrinsics as "may be
// used uninitialized" (GCC bug 105593); the warning sits on the header's lines, so it is
// silenced for the header alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "memfit/core/dtype.h"

namespace memfit::kernels::flash {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// exp2 arguments are clamped here: 2^-100 is still a normal float (no denormal slow paths in
// the products that follow) and far too small to change a sum that holds a 1.
constexpr float kExp2Floor = -100.0f;

// bf16 pairs are read as 32-bit words from memory written as 16-bit elements.
using PairWord = uint32_t __attribute__((__may_alias__));

inline uint32_t pair_of(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

}  // namespace

#if defined(__AVX512F__)

namespace {

// 2^x for x <= 0 (larger x work too), relative error about 1.3e-7.
inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExp2Floor));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);  // in [-0.5, 0.5]
  // 2^f = e^(f ln 2): Taylor series to degree 6; the first omitted term is below 1.3e-7.
  __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Lanes [0, n), n clamped to [0, 16].
inline __mmask16 lanes_below(int64_t n) {
  if (n >= kLanes) return 0xFFFF;
  if (n <= 0) return 0;
  return static_cast<__mmask16>((1u << n) - 1);
}

// f32 lanes rounded to bf16 (nearest even), the 16 bits in the low half of each 32-bit lane.
// Inputs are finite here (probabilities and their gradients).
inline __m512i bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))),
                           16);
}

// c += a . b over the bf16 pairs of each 32-bit lane.
inline __m512 dot_pairs(__m512 c, __m512i a, __m512i b) {
#if defined(__AVX512BF16__)
  return _mm512_dpbf16_ps(c, (__m512bh)a, (__m512bh)b);
#else
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  c = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                      _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), c);
  return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, hi)),
                         _mm512_castsi512_ps(_mm512_and_si512(b, hi)), c);
#endif
}

// 16 x 16 transpose in registers: r[i] holds row i on entry and column i on return.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[4g + c] now holds, per 128-bit lane L, rows 4g..4g+3 of column 4L + c.
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xDD);
    r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xDD);
  }
}

// The register-blocked kernels: an MR x (NV * 16) block of C stays in registers for the
// whole k loop; each step loads NV vectors of B and broadcasts MR elements of A. `tail` masks
// the last vector's columns.
template <int MR, int NV>
void micro_f32(int K, const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t ldb,
               float* C, int64_t ldc, bool accumulate, __mmask16 tail) {
  __m512 c[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mk = v == NV - 1 ? tail : __mmask16(0xFFFF);
      c[r][v] = accumulate ? _mm512_maskz_loadu_ps(mk, C + r * ldc + v * kLanes)
                           : _mm512_setzero_ps();
    }
  }
  for (int k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    const float* a = A + k * a_cs;
    __m512 bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(tail, b + v * kLanes)
                          : _mm512_loadu_ps(b + v * kLanes);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * a_rs]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(ar, bv[v], c[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mk = v == NV - 1 ? tail : __mmask16(0xFFFF);
      _mm512_mask_storeu_ps(C + r * ldc + v * kLanes, mk, c[r][v]);
    }
  }
}

template <int MR, int NV>
void micro_bf16(int K2, const uint32_t* A, int64_t a_rs, int64_t a_cs, const uint32_t* B,
                int64_t ldb, float* C, int64_t ldc, bool accumulate, __mmask16 tail) {
  __m512 c[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mk = v == NV - 1 ? tail : __mmask16(0xFFFF);
      c[r][v] = accumulate ? _mm512_maskz_loadu_ps(mk, C + r * ldc + v * kLanes)
                           : _mm512_setzero_ps();
    }
  }
  for (int k = 0; k < K2; ++k) {
    const uint32_t* b = B + k * ldb;
    const PairWord* a = reinterpret_cast<const PairWord*>(A + k * a_cs);
    __m512i bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(tail, b + v * kLanes)
                          : _mm512_loadu_si512(b + v * kLanes);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512i ar = _mm512_set1_epi32(static_cast<int>(a[r * a_rs]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = dot_pairs(c[r][v], ar, bv[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mk = v == NV - 1 ? tail : __mmask16(0xFFFF);
      _mm512_mask_storeu_ps(C + r * ldc + v * kLanes, mk, c[r][v]);
    }
  }
}

// Rows per block for NV vectors of columns: as many accumulators as fit in the 32 zmm
// registers next to the NV vectors of B.
template <int NV>
constexpr int kRows = NV <= 2 ? 12 : NV == 3 ? 8 : NV == 4 ? 6 : 5;

template <typename T>
using Micro = void (*)(int, const T*, int64_t, int64_t, const T*, int64_t, float*, int64_t,
                       bool, __mmask16);

template <typename T, int MR, int NV>
constexpr Micro<T> micro_for() {
  if constexpr (std::is_same_v<T, float>) {
    return &micro_f32<MR, NV>;
  } else {
    return &micro_bf16<MR, NV>;
  }
}

template <typename T, int NV, int... R>
constexpr std::array<Micro<T>, sizeof...(R)> row_table(std::integer_sequence<int, R...>) {
  return {micro_for<T, R + 1, NV>()...};
}

// All rows of one column panel of NV vectors.
template <typename T, int NV>
void panel(int M, int K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t ldb,
           float* C, int64_t ldc, bool accumulate, __mmask16 tail) {
  constexpr int MR = kRows<NV>;
  static constexpr auto table = row_table<T, NV>(std::make_integer_sequence<int, MR>{});
  for (int m0 = 0; m0 < M; m0 += MR) {
    const int mr = std::min(MR, M - m0);
    table[mr - 1](K, A + m0 * a_rs, a_rs, a_cs, B, ldb, C + m0 * ldc, ldc, accumulate, tail);
  }
}

// Column panels of 4 vectors (up to 5 for the last, so hs = 80 is one panel), rows within.
// The panel of B (K x 64 floats) stays in L1 while the row blocks pass over it.
template <typename T>
void gemm_any(int M, int N, int K, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  const int nvec = (N + kLanes - 1) / kLanes;
  for (int v0 = 0; v0 < nvec;) {
    const int nv = nvec - v0 <= 5 ? nvec - v0 : 4;
    const bool last = v0 + nv == nvec;
    const __mmask16 tail = last ? lanes_below(N - (nvec - 1) * kLanes) : __mmask16(0xFFFF);
    const T* b = B + v0 * kLanes;
    float* c = C + v0 * kLanes;
    switch (nv) {
      case 1: panel<T, 1>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
      case 2: panel<T, 2>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
      case 3: panel<T, 3>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
      case 4: panel<T, 4>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
      default: panel<T, 5>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
    }
    v0 += nv;
  }
}

}  // namespace

void gemm_f32(int M, int N, int K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_any<float>(M, N, K, A, a_rs, a_cs, B, ldb, C, ldc, accumulate);
}


void gemm_bf16(int M, int N, int K2, const uint32_t* A, int64_t lda, const uint32_t* B,
               int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (amx_active()) {
    gemm_amx(static_cast<int>(round_tile(M)), static_cast<int>(round_tile(N)),
             static_cast<int>(round_tile(K2)), A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  gemm_any<uint32_t>(M, N, K2, A, lda, 1, B, ldb, C, ldc, accumulate);
}

void online_softmax_step(float* St, int64_t ld, int nk, int nqp, int64_t k0, int64_t q0, float c,
                         float* m, float* l, float* alpha) {
  const __m512 vc = _mm512_set1_ps(c);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  for (int i0 = 0; i0 < nqp; i0 += kLanes) {
    const int64_t qb = q0 + i0;
    // Key k0 + j is visible to lane i when k0 + j <= qb + i: lanes [k0 + j - qb, 16).
    const bool diagonal = k0 + nk - 1 > qb;
    auto visible = [&](int j) { return static_cast<__mmask16>(~lanes_below(k0 + j - qb)); };
    const __m512 m_old = _mm512_loadu_ps(m + i0);
    __m512 mx = m_old;
    for (int j = 0; j < nk; ++j) {
      float* s = St + j * ld + i0;
      __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s), vc);
      if (diagonal) x = _mm512_mask_blend_ps(visible(j), neg_inf, x);
      _mm512_storeu_ps(s, x);
      mx = _mm512_max_ps(mx, x);
    }
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nk; ++j) {
      float* s = St + j * ld + i0;
      __m512 p = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s), mx));
      if (diagonal) p = _mm512_maskz_mov_ps(visible(j), p);
      _mm512_storeu_ps(s, p);
      sum = _mm512_add_ps(sum, p);
    }
    const __m512 a = exp2_ps(_mm512_sub_ps(m_old, mx));
    _mm512_storeu_ps(l + i0, _mm512_fmadd_ps(_mm512_loadu_ps(l + i0), a, sum));
    _mm512_storeu_ps(m + i0, mx);
    _mm512_storeu_ps(alpha + i0, a);
  }
}

void probs_and_grads(float* S, float* dP, int64_t ld, int nq, int nk, int nkp, int64_t q0,
                     int64_t k0, float c, const float* lse2, const float* D) {
  const __m512 vc = _mm512_set1_ps(c);
  for (int i = 0; i < nq; ++i) {
    const __m512 l2 = _mm512_set1_ps(lse2[i]);
    const __m512 d = _mm512_set1_ps(D[i]);
    float* s = S + i * ld;
    float* dp = dP + i * ld;
    for (int j0 = 0; j0 < nkp; j0 += kLanes) {
      // Keys j < nk with k0 + j <= q0 + i.
      const __mmask16 mk = lanes_below(std::min<int64_t>(nk - j0, q0 + i - k0 - j0 + 1));
      if (mk == 0) {
        _mm512_storeu_ps(s + j0, _mm512_setzero_ps());
        _mm512_storeu_ps(dp + j0, _mm512_setzero_ps());
        continue;
      }
      const __m512 p =
          _mm512_maskz_mov_ps(mk, exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + j0), vc, l2)));
      _mm512_storeu_ps(s + j0, p);
      _mm512_storeu_ps(dp + j0, _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + j0), d)));
    }
  }
}

void transpose_padded(float* dst, int64_t ld_dst, const float* src, int64_t src_rs, int rows,
                      int cols) {
  __m512 r[16];
  for (int r0 = 0; r0 < rows; r0 += kLanes) {
    const int nr = std::min(kLanes, rows - r0);
    for (int c0 = 0; c0 < cols; c0 += kLanes) {
      const int nc = std::min(kLanes, cols - c0);
      const __mmask16 mk = lanes_below(nc);
      for (int i = 0; i < kLanes; ++i) {
        r[i] = i < nr ? _mm512_maskz_loadu_ps(mk, src + (r0 + i) * src_rs + c0)
                      : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int c = 0; c < nc; ++c) _mm512_storeu_ps(dst + (c0 + c) * ld_dst + r0, r[c]);
    }
  }
}

void transpose_padded(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t src_rs,
                      int rows, int cols) {
  // Only loads, shuffles and stores: the bits pass through unchanged.
  transpose_padded(reinterpret_cast<float*>(dst), ld_dst, reinterpret_cast<const float*>(src),
                   src_rs, rows, cols);
}

float dot(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mk = lanes_below(n - i);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + i), _mm512_maskz_loadu_ps(mk, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

float dot(const uint16_t* a, const uint16_t* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i))), 16));
    const __m512 y = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i))), 16));
    acc = _mm512_fmadd_ps(x, y, acc);
  }
  float sum = _mm512_reduce_add_ps(acc);
  for (; i < n; ++i) sum += f32_from_bf16(a[i]) * f32_from_bf16(b[i]);
  return sum;
}

void pack_pairs_interleave(uint32_t* dst, int64_t ld_dst, const uint16_t* src, int64_t src_rs,
                           int rows, int cols) {
  for (int k2 = 0; k2 < (rows + 1) / 2; ++k2) {
    const uint16_t* r0 = src + 2 * k2 * src_rs;
    const uint16_t* r1 = 2 * k2 + 1 < rows ? r0 + src_rs : nullptr;
    uint32_t* d = dst + k2 * ld_dst;
    int n = 0;
    for (; n + kLanes <= cols; n += kLanes) {
      const __m512i lo = _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + n)));
      const __m512i hi = r1 ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(r1 + n)))
                            : _mm512_setzero_si512();
      _mm512_storeu_si512(d + n, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    for (; n < cols; ++n) d[n] = pair_of(r0[n], r1 ? r1[n] : uint16_t{0});
  }
}

void pack_pairs_interleave(uint32_t* dst, int64_t ld_dst, const float* src, int64_t src_rs,
                           int rows, int cols) {
  for (int k2 = 0; k2 < (rows + 1) / 2; ++k2) {
    const float* r0 = src + 2 * k2 * src_rs;
    const float* r1 = 2 * k2 + 1 < rows ? r0 + src_rs : nullptr;
    uint32_t* d = dst + k2 * ld_dst;
    for (int n = 0; n < cols; n += kLanes) {
      const __mmask16 mk = lanes_below(cols - n);
      const __m512i lo = bf16_bits(_mm512_maskz_loadu_ps(mk, r0 + n));
      const __m512i hi = r1 ? bf16_bits(_mm512_maskz_loadu_ps(mk, r1 + n)) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(d + n, mk, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

void convert_to_bf16(uint16_t* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows,
                     int cols) {
  for (int r = 0; r < rows; ++r) {
    int n = 0;
    for (; n + kLanes <= cols; n += kLanes) {
      const __m512i b = bf16_bits(_mm512_loadu_ps(src + r * ld_src + n));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + r * ld_dst + n),
                          _mm512_cvtepi32_epi16(b));
    }
    for (; n < cols; ++n) dst[r * ld_dst + n] = bf16_from_f32(src[r * ld_src + n]);
  }
}

#else  // portable path

namespace {

template <typename T>
T load_a(const T* A, int64_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return A[i];
  } else {
    return reinterpret_cast<const PairWord*>(A)[i];
  }
}

template <typename T>
void gemm_plain(int M, int N, int K, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
                int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  for (int m = 0; m < M; ++m) {
    float* c = C + m * ldc;
    if (!accumulate) std::fill(c, c + N, 0.0f);
    for (int k = 0; k < K; ++k) {
      const T a = load_a(A, m * a_rs + k * a_cs);
      const T* b = B + k * ldb;
      if constexpr (std::is_same_v<T, float>) {
        for (int n = 0; n < N; ++n) c[n] += a * b[n];
      } else {
        const float a0 = f32_from_bf16(static_cast<uint16_t>(a & 0xFFFF));
        const float a1 = f32_from_bf16(static_cast<uint16_t>(a >> 16));
        for (int n = 0; n < N; ++n) {
          c[n] += a0 * f32_from_bf16(static_cast<uint16_t>(b[n] & 0xFFFF)) +
                  a1 * f32_from_bf16(static_cast<uint16_t>(b[n] >> 16));
        }
      }
    }
  }
}

}  // namespace

void gemm_f32(int M, int N, int K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_plain<float>(M, N, K, A, a_rs, a_cs, B, ldb, C, ldc, accumulate);
}

void gemm_bf16(int M, int N, int K2, const uint32_t* A, int64_t lda, const uint32_t* B,
               int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_plain<uint32_t>(M, N, K2, A, lda, 1, B, ldb, C, ldc, accumulate);
}

void online_softmax_step(float* St, int64_t ld, int nk, int nqp, int64_t k0, int64_t q0, float c,
                         float* m, float* l, float* alpha) {
  for (int i = 0; i < nqp; ++i) {
    const int64_t q = q0 + i;
    float mx = m[i];
    for (int j = 0; j < nk; ++j) {
      float& s = St[j * ld + i];
      s = k0 + j <= q ? s * c : kNegInf;
      mx = std::max(mx, s);
    }
    float sum = 0;
    for (int j = 0; j < nk; ++j) {
      float& s = St[j * ld + i];
      s = k0 + j <= q ? std::exp2(std::max(s - mx, kExp2Floor)) : 0.0f;
      sum += s;
    }
    alpha[i] = std::exp2(std::max(m[i] - mx, kExp2Floor));
    l[i] = l[i] * alpha[i] + sum;
    m[i] = mx;
  }
}

void probs_and_grads(float* S, float* dP, int64_t ld, int nq, int nk, int nkp, int64_t q0,
                     int64_t k0, float c, const float* lse2, const float* D) {
  for (int i = 0; i < nq; ++i) {
    float* s = S + i * ld;
    float* dp = dP + i * ld;
    for (int j = 0; j < nkp; ++j) {
      const bool visible = j < nk && k0 + j <= q0 + i;
      const float p = visible ? std::exp2(std::max(s[j] * c - lse2[i], kExp2Floor)) : 0.0f;
      s[j] = p;
      dp[j] = visible ? p * (dp[j] - D[i]) : 0.0f;
    }
  }
}

template <typename T, typename Read>
void transpose_plain(T* dst, int64_t ld_dst, const Read* src, int64_t src_rs, int rows,
                     int cols) {
  const int64_t padded = round_lanes(rows);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r) dst[c * ld_dst + r] = src[r * src_rs + c];
    for (int64_t r = rows; r < padded; ++r) dst[c * ld_dst + r] = T{0};
  }
}

void transpose_padded(float* dst, int64_t ld_dst, const float* src, int64_t src_rs, int rows,
                      int cols) {
  transpose_plain(dst, ld_dst, src, src_rs, rows, cols);
}

void transpose_padded(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t src_rs,
                      int rows, int cols) {
  transpose_plain(dst, ld_dst, reinterpret_cast<const PairWord*>(src), src_rs, rows, cols);
}

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float dot(const uint16_t* a, const uint16_t* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += f32_from_bf16(a[i]) * f32_from_bf16(b[i]);
  return sum;
}

void pack_pairs_interleave(uint32_t* dst, int64_t ld_dst, const uint16_t* src, int64_t src_rs,
                           int rows, int cols) {
  for (int k2 = 0; k2 < (rows + 1) / 2; ++k2) {
    const uint16_t* r0 = src + 2 * k2 * src_rs;
    const uint16_t* r1 = 2 * k2 + 1 < rows ? r0 + src_rs : nullptr;
    for (int n = 0; n < cols; ++n) dst[k2 * ld_dst + n] = pair_of(r0[n], r1 ? r1[n] : uint16_t{0});
  }
}

void pack_pairs_interleave(uint32_t* dst, int64_t ld_dst, const float* src, int64_t src_rs,
                           int rows, int cols) {
  for (int k2 = 0; k2 < (rows + 1) / 2; ++k2) {
    const float* r0 = src + 2 * k2 * src_rs;
    const float* r1 = 2 * k2 + 1 < rows ? r0 + src_rs : nullptr;
    for (int n = 0; n < cols; ++n) {
      dst[k2 * ld_dst + n] = pair_of(bf16_from_f32(r0[n]), r1 ? bf16_from_f32(r1[n]) : uint16_t{0});
    }
  }
}

void convert_to_bf16(uint16_t* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows,
                     int cols) {
  for (int r = 0; r < rows; ++r) {
    for (int n = 0; n < cols; ++n) dst[r * ld_dst + n] = bf16_from_f32(src[r * ld_src + n]);
  }
}

#endif  // __AVX512F__

}  // namespace memfit::kernels::flash
