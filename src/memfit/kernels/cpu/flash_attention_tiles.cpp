// Flash attention tile operations (see flash_attention_tiles.h), written once with Highway and
// compiled for every SIMD target (simd.h): AVX3 and AVX2 register-blocked micro-GEMMs, the
// online-softmax and gradient steps on whole vectors, and the bf16 packings. Where the CPU has
// AVX512_BF16 (cpu::has, so MEMFIT_MAX_ISA can turn it off), the AVX3 target's bf16 product
// runs on _mm512_dpbf16_ps in a function compiled for that extension alone; the AMX products
// are in flash_attention_amx.cpp. See "Note [Flash attention]" in docs/notes/flash-attention.md.
#include "memfit/kernels/cpu/flash_attention_tiles.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/flash_attention_tiles.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <limits>
#include <type_traits>
#include <utility>

#include "memfit/core/cpu.h"
#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/simd-inl.h"

#if HWY_TARGET <= HWY_AVX3 && !defined(MEMFIT_FLASH_TILES_IMMINTRIN_)
#define MEMFIT_FLASH_TILES_IMMINTRIN_
// GCC 12's AVX-512 headers trip -Wuninitialized on their own "undefined" operands (GCC
// PR105593); the warning is reported at the header's lines, so silence it there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#ifndef MEMFIT_FLASH_TILES_SHARED_
#define MEMFIT_FLASH_TILES_SHARED_
namespace memfit::kernels::flash::detail {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// bf16 pairs are read as 32-bit words from memory written as 16-bit elements.
using PairWord = uint32_t __attribute__((__may_alias__));
inline uint32_t pair_of(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}
}  // namespace memfit::kernels::flash::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace {
using flash::kLanes;
using flash::detail::kNegInf;
using flash::detail::pair_of;
using flash::detail::PairWord;

// Column vectors per panel and rows per register block. AVX3 has 32 vector registers: panels
// of 4 vectors (64 floats; up to 5 for the last, so hs = 80 is one panel) and 12/8/6/5 rows.
// AVX2 has 16: panels of 2 vectors (16 floats; up to 3), 6 rows, so accumulators, the B
// vectors and a broadcast fit. The emulated bf16 kernel holds each B vector twice (its even and
// odd halves widened) and three more (the broadcast pair, its halves; the mask as an operand),
// so it takes fewer rows: MR * NV + 2 * NV + 3 registers at most. With AVX2's 6 x 2 block it
// spilled two accumulators to the stack every k step (perf: 38% of its samples on those two
// instructions), at 0.925 ms against f32's 0.738 ms for a T = 256 forward.
#if HWY_TARGET <= HWY_AVX3
constexpr int kPanelVecs = 4;
template <int NV>
constexpr int kRows = NV <= 2 ? 12 : NV == 3 ? 8 : NV == 4 ? 6 : 5;
template <int NV>
constexpr int kRowsEmulated = NV <= 2 ? 12 : NV == 3 ? 6 : NV == 4 ? 5 : 3;
#else
constexpr int kPanelVecs = 2;
template <int NV>
constexpr int kRows = NV == 1 ? 8 : NV == 2 ? 6 : 4;
template <int NV>
constexpr int kRowsEmulated = NV == 1 ? 8 : NV == 2 ? 4 : 2;
#endif

// The MR x NV accumulator block of C: loaded (or zeroed) before the k loop and stored after
// it, the last vector of each row masked to its first `tail` lanes. Shared by the f32 and bf16
// micro-kernels.
template <int MR, int NV>
HWY_INLINE void load_block(VF (&c)[MR][NV], const float* C, int64_t ldc, bool accumulate,
                           size_t tail) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto mk = hn::FirstN(d, tail);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const float* p = C + r * ldc + v * N;
      c[r][v] = !accumulate     ? hn::Zero(d)
                : v == NV - 1   ? hn::MaskedLoad(mk, d, p)
                                : hn::LoadU(d, p);
    }
  }
}

template <int MR, int NV>
HWY_INLINE void store_block(const VF (&c)[MR][NV], float* C, int64_t ldc, size_t tail) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto mk = hn::FirstN(d, tail);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* p = C + r * ldc + v * N;
      if (v == NV - 1) hn::BlendedStore(c[r][v], mk, d, p);
      else hn::StoreU(c[r][v], d, p);
    }
  }
}

// The register-blocked kernels: an MR x (NV lanes) block of C stays in registers for the whole
// k loop; each step loads NV vectors of B and broadcasts MR elements of A. The last vector's
// columns are the first `tail` lanes.
template <int MR, int NV>
void micro_f32(int K, const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t ldb,
               float* C, int64_t ldc, bool accumulate, size_t tail) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto mk = hn::FirstN(d, tail);
  VF c[MR][NV];
  load_block<MR, NV>(c, C, ldc, accumulate, tail);
  for (int k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    const float* a = A + k * a_cs;
    VF bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      bv[v] = v == NV - 1 ? hn::MaskedLoad(mk, d, b + v * N) : hn::LoadU(d, b + v * N);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const VF ar = hn::Set(d, a[r * a_rs]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = hn::MulAdd(ar, bv[v], c[r][v]);
    }
  }
  store_block<MR, NV>(c, C, ldc, tail);
}

// The same over bf16 pairs: c += a_lo b_lo, then += a_hi b_hi, each an exact widening and one
// fused multiply-add (what _mm512_dpbf16_ps computes, up to its rounding).
template <int MR, int NV>
void micro_bf16(int K2, const uint32_t* A, int64_t a_rs, int64_t a_cs, const uint32_t* B,
                int64_t ldb, float* C, int64_t ldc, bool accumulate, size_t tail) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto mku = hn::FirstN(du, tail);
  const auto hi_mask = hn::Set(du, 0xFFFF0000u);
  VF c[MR][NV];
  load_block<MR, NV>(c, C, ldc, accumulate, tail);
  for (int k = 0; k < K2; ++k) {
    const uint32_t* b = B + k * ldb;
    const PairWord* a = reinterpret_cast<const PairWord*>(A + k * a_cs);
    VF blo[NV], bhi[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const auto bv = v == NV - 1 ? hn::MaskedLoad(mku, du, b + v * N) : hn::LoadU(du, b + v * N);
      blo[v] = hn::BitCast(d, hn::ShiftLeft<16>(bv));
      bhi[v] = hn::BitCast(d, hn::And(bv, hi_mask));
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      // The pair broadcast once (a load), split in the vector unit: two ALU operations where
      // splitting in scalar registers and broadcasting each half took about seven.
      const auto aw = hn::Set(du, a[r * a_rs]);
      const VF alo = hn::BitCast(d, hn::ShiftLeft<16>(aw));
      const VF ahi = hn::BitCast(d, hn::And(aw, hi_mask));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        c[r][v] = hn::MulAdd(ahi, bhi[v], hn::MulAdd(alo, blo[v], c[r][v]));
    }
  }
  store_block<MR, NV>(c, C, ldc, tail);
}

#if HWY_TARGET <= HWY_AVX3
// AVX512_BF16's dot product of pairs, in a function compiled for that extension only: it runs
// only where cpu::has(Isa::avx512_bf16), chosen in gemm_any below.
#define MEMFIT_DPBF16_TARGET \
  __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
template <int MR, int NV>
MEMFIT_DPBF16_TARGET void micro_dpbf16(int K2, const uint32_t* A, int64_t a_rs, int64_t a_cs,
                                       const uint32_t* B, int64_t ldb, float* C, int64_t ldc,
                                       bool accumulate, size_t tail) {
  const __mmask16 tm = static_cast<__mmask16>(tail >= 16 ? 0xFFFFu : (1u << tail) - 1u);
  __m512 c[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mk = v == NV - 1 ? tm : __mmask16(0xFFFF);
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
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(tm, b + v * kLanes)
                          : _mm512_loadu_si512(b + v * kLanes);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512i ar = _mm512_set1_epi32(static_cast<int>(a[r * a_rs]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)ar, (__m512bh)bv[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mk = v == NV - 1 ? tm : __mmask16(0xFFFF);
      _mm512_mask_storeu_ps(C + r * ldc + v * kLanes, mk, c[r][v]);
    }
  }
}
#endif

template <typename T>
using Micro = void (*)(int, const T*, int64_t, int64_t, const T*, int64_t, float*, int64_t,
                       bool, size_t);

// kind: 0 f32, 1 bf16 emulated, 2 bf16 on AVX512_BF16 (AVX3 only).
template <typename T, int kKind, int MR, int NV>
constexpr Micro<T> micro_for() {
  if constexpr (kKind == 0) {
    return &micro_f32<MR, NV>;
#if HWY_TARGET <= HWY_AVX3
  } else if constexpr (kKind == 2) {
    return &micro_dpbf16<MR, NV>;
#endif
  } else {
    return &micro_bf16<MR, NV>;
  }
}

template <typename T, int kKind, int NV, int... R>
constexpr std::array<Micro<T>, sizeof...(R)> row_table(std::integer_sequence<int, R...>) {
  return {micro_for<T, kKind, R + 1, NV>()...};
}

// All rows of one column panel of NV vectors.
template <typename T, int kKind, int NV>
void panel(int M, int K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t ldb,
           float* C, int64_t ldc, bool accumulate, size_t tail) {
  constexpr int MR = kKind == 1 ? kRowsEmulated<NV> : kRows<NV>;
  static constexpr auto table = row_table<T, kKind, NV>(std::make_integer_sequence<int, MR>{});
  for (int m0 = 0; m0 < M; m0 += MR) {
    const int mr = std::min(MR, M - m0);
    table[mr - 1](K, A + m0 * a_rs, a_rs, a_cs, B, ldb, C + m0 * ldc, ldc, accumulate, tail);
  }
}

// Column panels of kPanelVecs vectors (one more for the last), rows within. The panel of B
// stays in L1 while the row blocks pass over it.
template <typename T, int kKind>
void gemm_any(int M, int N, int K, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  const int lanes = static_cast<int>(hn::Lanes(DF()));
  const int nvec = (N + lanes - 1) / lanes;
  for (int v0 = 0; v0 < nvec;) {
    const int nv = nvec - v0 <= kPanelVecs + 1 ? nvec - v0 : kPanelVecs;
    const bool last = v0 + nv == nvec;
    const size_t tail = last ? static_cast<size_t>(N - (nvec - 1) * lanes) : lanes;
    const T* b = B + v0 * lanes;
    float* c = C + v0 * lanes;
    switch (nv) {
      case 1: panel<T, kKind, 1>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
      case 2: panel<T, kKind, 2>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
      case 3: panel<T, kKind, 3>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
#if HWY_TARGET <= HWY_AVX3
      case 4: panel<T, kKind, 4>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
      default: panel<T, kKind, 5>(M, K, A, a_rs, a_cs, b, ldb, c, ldc, accumulate, tail); break;
#else
      default: break;
#endif
    }
    v0 += nv;
  }
}

#if HWY_TARGET <= HWY_AVX3
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
#endif

}  // namespace

void GemmF32(int M, int N, int K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_any<float, 0>(M, N, K, A, a_rs, a_cs, B, ldb, C, ldc, accumulate);
}

void GemmBf16(int M, int N, int K2, const uint32_t* A, int64_t lda, const uint32_t* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate) {
#if HWY_TARGET <= HWY_AVX3
  static const bool dp = cpu::has(cpu::Isa::avx512_bf16);
  if (dp) return gemm_any<uint32_t, 2>(M, N, K2, A, lda, 1, B, ldb, C, ldc, accumulate);
#endif
  gemm_any<uint32_t, 1>(M, N, K2, A, lda, 1, B, ldb, C, ldc, accumulate);
}

void OnlineSoftmaxStep(float* St, int64_t ld, int nk, int nqp, int64_t k0, int64_t q0, float c,
                       float* m, float* l, float* alpha) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vc = hn::Set(d, c);
  const VF neg_inf = hn::Set(d, kNegInf);
  for (int i0 = 0; i0 < nqp; i0 += static_cast<int>(N)) {
    const int64_t qb = q0 + i0;
    // Key k0 + j is visible to lane i when k0 + j <= qb + i: lanes [k0 + j - qb, N).
    const bool diagonal = k0 + nk - 1 > qb;
    auto visible = [&](int j) {
      return hn::Not(hn::FirstN(d, static_cast<size_t>(std::clamp<int64_t>(k0 + j - qb, 0, N))));
    };
    const VF m_old = hn::LoadU(d, m + i0);
    VF mx = m_old;
    for (int j = 0; j < nk; ++j) {
      float* s = St + j * ld + i0;
      VF x = hn::Mul(hn::LoadU(d, s), vc);
      if (diagonal) x = hn::IfThenElse(visible(j), x, neg_inf);
      hn::StoreU(x, d, s);
      mx = hn::Max(mx, x);
    }
    VF sum = hn::Zero(d);
    for (int j = 0; j < nk; ++j) {
      float* s = St + j * ld + i0;
      VF p = exp2(d, hn::Sub(hn::LoadU(d, s), mx));
      if (diagonal) p = hn::IfThenElseZero(visible(j), p);
      hn::StoreU(p, d, s);
      sum = hn::Add(sum, p);
    }
    const VF a = exp2(d, hn::Sub(m_old, mx));
    hn::StoreU(hn::MulAdd(hn::LoadU(d, l + i0), a, sum), d, l + i0);
    hn::StoreU(mx, d, m + i0);
    hn::StoreU(a, d, alpha + i0);
  }
}

void ProbsAndGrads(float* S, float* dP, int64_t ld, int nq, int nk, int nkp, int64_t q0,
                   int64_t k0, float c, const float* lse2, const float* D) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vc = hn::Set(d, c);
  for (int i = 0; i < nq; ++i) {
    const VF l2 = hn::Set(d, lse2[i]);
    const VF dd = hn::Set(d, D[i]);
    float* s = S + i * ld;
    float* dp = dP + i * ld;
    for (int j0 = 0; j0 < nkp; j0 += static_cast<int>(N)) {
      // Keys j < nk with k0 + j <= q0 + i.
      const int64_t valid = std::clamp<int64_t>(std::min<int64_t>(nk - j0, q0 + i - k0 - j0 + 1),
                                                0, N);
      if (valid == 0) {
        hn::StoreU(hn::Zero(d), d, s + j0);
        hn::StoreU(hn::Zero(d), d, dp + j0);
        continue;
      }
      const VF p = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(valid)),
                                      exp2(d, hn::MulSub(hn::LoadU(d, s + j0), vc, l2)));
      hn::StoreU(p, d, s + j0);
      hn::StoreU(hn::Mul(p, hn::Sub(hn::LoadU(d, dp + j0), dd)), d, dp + j0);
    }
  }
}

// dst (cols x round_lanes(rows)) = src^T, zero in the padding columns. AVX3 transposes 16 x 16
// blocks in registers; the other targets copy element by element (bits unchanged either way).
void TransposePadded(float* dst, int64_t ld_dst, const float* src, int64_t src_rs, int rows,
                     int cols) {
#if HWY_TARGET <= HWY_AVX3
  __m512 r[16];
  for (int r0 = 0; r0 < rows; r0 += kLanes) {
    const int nr = std::min(kLanes, rows - r0);
    for (int c0 = 0; c0 < cols; c0 += kLanes) {
      const int nc = std::min(kLanes, cols - c0);
      const __mmask16 mk = static_cast<__mmask16>(nc >= 16 ? 0xFFFFu : (1u << nc) - 1u);
      for (int i = 0; i < kLanes; ++i) {
        r[i] = i < nr ? _mm512_maskz_loadu_ps(mk, src + (r0 + i) * src_rs + c0)
                      : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int c = 0; c < nc; ++c) _mm512_storeu_ps(dst + (c0 + c) * ld_dst + r0, r[c]);
    }
  }
#else
  const int64_t padded = flash::round_lanes(rows);
  const PairWord* s = reinterpret_cast<const PairWord*>(src);
  PairWord* o = reinterpret_cast<PairWord*>(dst);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r) o[c * ld_dst + r] = s[r * src_rs + c];
    for (int64_t r = rows; r < padded; ++r) o[c * ld_dst + r] = 0;
  }
#endif
}

float DotF32(const float* a, const float* b, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= n; i += N) acc = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc);
  if (i < n)
    acc = hn::MulAdd(load_n<DType::f32>(d, a + i, n - i), load_n<DType::f32>(d, b + i, n - i),
                     acc);
  return sum_lanes(d, acc);
}

float DotBf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= n; i += N)
    acc = hn::MulAdd(load<DType::bf16>(d, a + i), load<DType::bf16>(d, b + i), acc);
  float sum = sum_lanes(d, acc);
  for (; i < n; ++i) sum += f32_from_bf16(a[i]) * f32_from_bf16(b[i]);
  return sum;
}

void PackPairsBf16(uint32_t* dst, int64_t ld_dst, const uint16_t* src, int64_t src_rs, int rows,
                   int cols) {
  const hn::ScalableTag<uint32_t> du;
  const hn::Rebind<uint16_t, decltype(du)> d16;
  const int N = static_cast<int>(hn::Lanes(du));
  for (int k2 = 0; k2 < (rows + 1) / 2; ++k2) {
    const uint16_t* r0 = src + 2 * k2 * src_rs;
    const uint16_t* r1 = 2 * k2 + 1 < rows ? r0 + src_rs : nullptr;
    uint32_t* o = dst + k2 * ld_dst;
    int n = 0;
    for (; n + N <= cols; n += N) {
      const auto lo = hn::PromoteTo(du, hn::LoadU(d16, r0 + n));
      const auto hi = r1 ? hn::PromoteTo(du, hn::LoadU(d16, r1 + n)) : hn::Zero(du);
      hn::StoreU(hn::Or(lo, hn::ShiftLeft<16>(hi)), du, o + n);
    }
    for (; n < cols; ++n) o[n] = pair_of(r0[n], r1 ? r1[n] : uint16_t{0});
  }
}

void PackPairsF32(uint32_t* dst, int64_t ld_dst, const float* src, int64_t src_rs, int rows,
                  int cols) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  for (int k2 = 0; k2 < (rows + 1) / 2; ++k2) {
    const float* r0 = src + 2 * k2 * src_rs;
    const float* r1 = 2 * k2 + 1 < rows ? r0 + src_rs : nullptr;
    uint32_t* o = dst + k2 * ld_dst;
    int n = 0;
    for (; n + N <= cols; n += N) {
      const auto lo = bf16_bits(d, hn::LoadU(d, r0 + n));
      const auto hi = r1 ? bf16_bits(d, hn::LoadU(d, r1 + n)) : hn::Zero(hn::RebindToUnsigned<DF>());
      hn::StoreU(hn::Or(lo, hn::ShiftLeft<16>(hi)), hn::RebindToUnsigned<DF>(), o + n);
    }
    for (; n < cols; ++n)
      o[n] = pair_of(bf16_from_f32(r0[n]), r1 ? bf16_from_f32(r1[n]) : uint16_t{0});
  }
}

void ConvertToBf16(uint16_t* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows,
                   int cols, float scale) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vs = hn::Set(d, scale);
  for (int r = 0; r < rows; ++r) {
    int n = 0;
    for (; n + N <= cols; n += N)
      store<DType::bf16>(d, hn::Mul(hn::LoadU(d, src + r * ld_src + n), vs), dst + r * ld_dst + n);
    for (; n < cols; ++n) dst[r * ld_dst + n] = bf16_from_f32(src[r * ld_src + n] * scale);
  }
}

void AddRows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows, int cols) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  for (int r = 0; r < rows; ++r) {
    float* o = dst + r * ld_dst;
    const float* a = src + r * ld_src;
    int n = 0;
    for (; n + N <= cols; n += N) {
      hn::StoreU(hn::Add(hn::LoadU(d, o + n), hn::LoadU(d, a + n)), d, o + n);
    }
    for (; n < cols; ++n) o[n] += a[n];
  }
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(GemmF32);
HWY_EXPORT(GemmBf16);
HWY_EXPORT(OnlineSoftmaxStep);
HWY_EXPORT(ProbsAndGrads);
HWY_EXPORT(TransposePadded);
HWY_EXPORT(DotF32);
HWY_EXPORT(DotBf16);
HWY_EXPORT(PackPairsBf16);
HWY_EXPORT(PackPairsF32);
HWY_EXPORT(ConvertToBf16);
HWY_EXPORT(AddRows);
}  // namespace memfit::kernels

namespace memfit::kernels::flash {

void gemm_f32(int M, int N, int K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
              int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  MEMFIT_SIMD_DISPATCH(GemmF32)(M, N, K, A, a_rs, a_cs, B, ldb, C, ldc, accumulate);
}

void gemm_bf16(int M, int N, int K2, const uint32_t* A, int64_t lda, const uint32_t* B,
               int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (amx_active()) {
    gemm_amx(static_cast<int>(round_tile(M)), static_cast<int>(round_tile(N)),
             static_cast<int>(round_tile(K2)), A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  MEMFIT_SIMD_DISPATCH(GemmBf16)(M, N, K2, A, lda, B, ldb, C, ldc, accumulate);
}

void online_softmax_step(float* St, int64_t ld, int nk, int nqp, int64_t k0, int64_t q0, float c,
                         float* m, float* l, float* alpha) {
  MEMFIT_SIMD_DISPATCH(OnlineSoftmaxStep)(St, ld, nk, nqp, k0, q0, c, m, l, alpha);
}

void probs_and_grads(float* S, float* dP, int64_t ld, int nq, int nk, int nkp, int64_t q0,
                     int64_t k0, float c, const float* lse2, const float* D) {
  MEMFIT_SIMD_DISPATCH(ProbsAndGrads)(S, dP, ld, nq, nk, nkp, q0, k0, c, lse2, D);
}

void transpose_padded(float* dst, int64_t ld_dst, const float* src, int64_t src_rs, int rows,
                      int cols) {
  MEMFIT_SIMD_DISPATCH(TransposePadded)(dst, ld_dst, src, src_rs, rows, cols);
}

void transpose_padded(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t src_rs,
                      int rows, int cols) {
  // Only loads, shuffles and stores: the bits pass through unchanged.
  MEMFIT_SIMD_DISPATCH(TransposePadded)(reinterpret_cast<float*>(dst), ld_dst,
                                        reinterpret_cast<const float*>(src), src_rs, rows, cols);
}

float dot(const float* a, const float* b, int64_t n) {
  return MEMFIT_SIMD_DISPATCH(DotF32)(a, b, n);
}

float dot(const uint16_t* a, const uint16_t* b, int64_t n) {
  return MEMFIT_SIMD_DISPATCH(DotBf16)(a, b, n);
}

void pack_pairs_interleave(uint32_t* dst, int64_t ld_dst, const uint16_t* src, int64_t src_rs,
                           int rows, int cols) {
  MEMFIT_SIMD_DISPATCH(PackPairsBf16)(dst, ld_dst, src, src_rs, rows, cols);
}

void pack_pairs_interleave(uint32_t* dst, int64_t ld_dst, const float* src, int64_t src_rs,
                           int rows, int cols) {
  MEMFIT_SIMD_DISPATCH(PackPairsF32)(dst, ld_dst, src, src_rs, rows, cols);
}

void convert_to_bf16(uint16_t* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows,
                     int cols, float scale) {
  MEMFIT_SIMD_DISPATCH(ConvertToBf16)(dst, ld_dst, src, ld_src, rows, cols, scale);
}

void add_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int rows, int cols) {
  MEMFIT_SIMD_DISPATCH(AddRows)(dst, ld_dst, src, ld_src, rows, cols);
}

}  // namespace memfit::kernels::flash
#endif  // HWY_ONCE
