// Loads and stores that widen bf16 / f16 to f32 and round f32 back, one element or 16 lanes at
// a time, so that a kernel written once over floats runs on any storage type: a template over
// DType picks the load and the store, and the f32 instance compiles to the same instructions as
// the hand-written f32 loop it replaces. Rounding is always to nearest, ties to even, and the
// vector and scalar paths give the same bits (core/dtype.h defines them). bf16 is rounded with
// integer arithmetic rather than vcvtneps2bf16, which flushes subnormal inputs to zero.
// Internal to the kernels; the public conversions are in convert.h.
#pragma once

#include <cstdint>
#include <type_traits>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/vec_math.h"  // <immintrin.h> behind GCC 12's warning workaround

// The 16-lane half loads and stores need AVX-512 BW and VL (16-bit masked moves) beside F;
// every AVX-512 core since Skylake-SP has all three, so the kernels' AVX-512 paths assume them.
#if defined(__AVX512F__) && !(defined(__AVX512BW__) && defined(__AVX512VL__))
#error "memfit's AVX-512 kernels need AVX512BW and AVX512VL as well as AVX512F"
#endif

namespace memfit::kernels::half {

// The C++ type an element of D is stored as: float, or the 16 bits of a bf16 / f16.
template <DType D>
using Storage = std::conditional_t<D == DType::f32, float, uint16_t>;

template <DType D>
inline float load1(const Storage<D>* p) {
  if constexpr (D == DType::f32)
    return *p;
  else if constexpr (D == DType::bf16)
    return f32_from_bf16(*p);
  else
    return f32_from_f16(*p);
}

template <DType D>
inline void store1(Storage<D>* p, float x) {
  if constexpr (D == DType::f32)
    *p = x;
  else if constexpr (D == DType::bf16)
    *p = bf16_from_f32(x);
  else
    *p = f16_from_f32(x);
}

// Calls fn(std::integral_constant<DType, D>) for the run-time dtype t (f32, bf16 or f16); the
// caller has already checked that t is one of them.
template <typename Fn>
inline decltype(auto) dispatch(DType t, Fn&& fn) {
  switch (t) {
    case DType::bf16:
      return fn(std::integral_constant<DType, DType::bf16>{});
    case DType::f16:
      return fn(std::integral_constant<DType, DType::f16>{});
    default:
      return fn(std::integral_constant<DType, DType::f32>{});
  }
}

inline bool is_float_type(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}
inline bool is_half_type(DType t) { return t == DType::bf16 || t == DType::f16; }

#if defined(__AVX512F__)

// bf16 bits (in the low half of each 32-bit lane) of 16 floats, rounded to nearest even; NaN
// becomes a quiet NaN as in bf16_from_f32.
inline __m512i bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

inline __m512 from_bf16_bits(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <DType D>
inline __m512 load16(const Storage<D>* p) {
  if constexpr (D == DType::f32)
    return _mm512_loadu_ps(p);
  else if constexpr (D == DType::bf16)
    return from_bf16_bits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  else
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Lanes outside m read as 0 (and memory there is not touched).
template <DType D>
inline __m512 maskz_load16(__mmask16 m, const Storage<D>* p) {
  if constexpr (D == DType::f32)
    return _mm512_maskz_loadu_ps(m, p);
  else if constexpr (D == DType::bf16)
    return from_bf16_bits(_mm256_maskz_loadu_epi16(m, p));
  else
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

template <DType D>
inline void store16(Storage<D>* p, __m512 v) {
  if constexpr (D == DType::f32)
    _mm512_storeu_ps(p, v);
  else if constexpr (D == DType::bf16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits(v)));
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <DType D>
inline void mask_store16(Storage<D>* p, __mmask16 m, __m512 v) {
  if constexpr (D == DType::f32)
    _mm512_mask_storeu_ps(p, m, v);
  else if constexpr (D == DType::bf16)
    _mm512_mask_cvtepi32_storeu_epi16(p, m, bf16_bits(v));
  else
    _mm256_mask_storeu_epi16(p, m,
                             _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Stochastic rounding (convert.h defines it element by element): sr_bits for the 16
// consecutive indices lo, lo + 1, ... under one key (the caller keeps them below 2^32 apart
// from the key's high part), and the bf16 bits of v rounded with those random bits.
inline __m512i sr_bits16(__m512i key, uint32_t lo) {
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i x =
      _mm512_xor_si512(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(lo)), iota), key);
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

inline __m512i bf16_stochastic_bits(__m512 v, __m512i random) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_srli_epi32(random, 16)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

#endif  // __AVX512F__

// dst[i] = src[i] for i < n, widening or rounding as the types say. One thread.
template <DType S, DType D>
inline void convert_n(Storage<D>* dst, const Storage<S>* src, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) store16<D>(dst + i, load16<S>(src + i));
  if (i < n) {
    const __mmask16 m = vec::tail_mask(n - i);
    mask_store16<D>(dst + i, m, maskz_load16<S>(m, src + i));
    return;
  }
#endif
  for (; i < n; ++i) store1<D>(dst + i, load1<S>(src + i));
}

}  // namespace memfit::kernels::half
