// Vector math for the CPU kernels: exp and tanh on 16 floats at once, and the horizontal
// reductions the row kernels share. glibc's expf and tanhf are scalar calls, and softmax over a
// 50k vocabulary or GELU over (B*T, 4C) spend most of their time in them; a Cephes-style range
// reduction plus polynomial in AVX-512 is several times faster and, measured on every 64th
// float of the range, within 1 ulp (exp) and 1.3 ulp (tanh) of the exact value.
// Everything here exists only under __AVX512F__; the kernels keep a scalar path (std::exp,
// std::tanh) for builds without it.
#pragma once

#if defined(__AVX512F__)
// GCC 12.2's AVX-512 headers trip -Wuninitialized on their own "undefined" operands (GCC
// PR105593, fixed in 12.3); the warning is reported at the header's lines, so silence it there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

namespace memfit::kernels::vec {

// A mask with the low n lanes (0 <= n <= 16) set, for the tail of a row.
inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1u);
}

// exp(x) for every lane. Range reduction x = n ln2 + r, |r| <= ln2/2, with ln2 split in a
// high and a low part and fused multiply-adds so r carries no cancellation error; e^r from
// Cephes' degree-6 minimax polynomial; the result is p * 2^n by vscalefps, which rounds once
// and gives 0 below about -103.9 (through the subnormals) and +inf above 88.72. x is clamped
// to [-104, 88.8] first so that n stays small; NaN passes through as NaN.
inline __m512 exp(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693145751953125f);
  const __m512 ln2_lo = _mm512_set1_ps(1.42860682030941723212e-6f);
  // max(lo, x) and min(hi, x) return x when x is NaN (the second operand wins).
  x = _mm512_min_ps(_mm512_set1_ps(88.8f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// tanh(x) for every lane, as Cephes' tanhf: an odd polynomial for |x| < 0.625, where
// 1 - 2/(e^2x + 1) would lose digits to cancellation, and that formula elsewhere. Both are
// computed and blended; the error is about 2 ulp everywhere, and +-1 for large |x|.
inline __m512 tanh(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 ax = _mm512_abs_ps(x);
  // Large branch on |x|, sign restored below: 1 - 2 / (e^{2|x|} + 1). 2|x| is capped at 40,
  // where tanh is 1 in float already, so d stays finite; 1/d is rcp14 plus one Newton step
  // (about 2^-28 relative), much cheaper than a division.
  const __m512 e = vec::exp(_mm512_min_ps(_mm512_set1_ps(40.0f), _mm512_add_ps(ax, ax)));
  const __m512 d = _mm512_add_ps(e, one);
  __m512 r = _mm512_rcp14_ps(d);
  r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, one), r);
  __m512 big = _mm512_fnmadd_ps(_mm512_set1_ps(2.0f), r, one);
  big = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_castps_si512(big),
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(0x80000000u)))));
  // Small branch: x + x^3 P(x^2).
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(is_small, big, small);
}

// Sum of the 16 lanes in double: the lanes are widened before they are added, so a row sum
// kept in a few float vectors loses nothing more at the end.
inline double reduce_add_pd(__m512 v) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const __m512d hi =
      _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

}  // namespace memfit::kernels::vec

#endif  // __AVX512F__
