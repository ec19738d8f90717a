// The one vector header of the CPU kernels: exp and tanh, the bf16 / f16 loads and stores that
// widen to f32 and round back, tails, and horizontal sums, written once with Google Highway and
// compiled for every target the kernel sources are (AVX2, AVX3, scalar; see
// docs/notes/simd-dispatch.md). A kernel source includes it after hwy/foreach_target.h, inside
// its HWY_NAMESPACE; the "-inl.h" name is Highway's convention for a header that is included
// once per target (hence the toggling guard below instead of #pragma once).
//
// exp: a Cephes-style range reduction plus polynomial, within 1 ulp of the exact value over the
// normal range; tanh: Cephes' tanhf, about 2 ulp. glibc's expf and tanhf are scalar calls, and
// softmax over a 50k vocabulary or GELU over (B*T, 4C) spend most of their time in them.
// Conversions round to nearest, ties to even, and give the same bits as core/dtype.h's scalar
// definitions on every target (bf16 is rounded with integer arithmetic rather than
// vcvtneps2bf16, which flushes subnormal inputs to zero).

#if defined(MEMFIT_KERNELS_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MEMFIT_KERNELS_CPU_SIMD_INL_H_
#undef MEMFIT_KERNELS_CPU_SIMD_INL_H_
#else
#define MEMFIT_KERNELS_CPU_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <cstring>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/half_vec.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The full-width f32 descriptor every kernel works in.
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
// Most lanes any target here has (16 on AVX3): the size of a tail's bounce buffer.
inline constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// exp(x) for every lane. Range reduction x = n ln2 + r, |r| <= ln2/2, with ln2 split in a high
// and a low part and fused multiply-adds so r carries no cancellation error; e^r from Cephes'
// degree-6 minimax polynomial; the result is p * 2^n, applied as two exact powers of two so it
// rounds once (as AVX-512's vscalefps would): 0 below about -103.9 (through the subnormals) and
// +inf above 88.72. x is clamped to [-104, 88.8] first so that n stays in [-150, 128]; NaN
// passes through as NaN. With FMA (AVX2, AVX3) every target gives the same bits.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V exp(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V x_in = x;
  // Max(lo, x) and Min(hi, x) return x when x is NaN on x86 (the second operand wins).
  x = hn::Min(hn::Set(d, 88.8f), hn::Max(hn::Set(d, -104.0f), x));
  const V n = hn::Round(hn::Mul(x, hn::Set(d, 1.44269504088896341f)));
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693145751953125f), x);
  r = hn::NegMulAdd(n, hn::Set(d, 1.42860682030941723212e-6f), r);
  V p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  p = hn::MulAdd(p, hn::Mul(r, r), r);
  p = hn::Add(p, hn::Set(d, 1.0f));
#if HWY_TARGET <= HWY_AVX3
  if constexpr (sizeof(p.raw) == 64) {  // AVX-512 has the scaling in one instruction
    const V y = V{_mm512_scalef_ps(p.raw, n.raw)};
    (void)x_in;
    (void)di;
    return y;
  }
#endif
  // 2^n = 2^n1 * 2^n2 with n1 = n >> 1: both halves are normal floats, p * 2^n1 is exact, so
  // the result rounds once, as vscalefps does.
  const auto ni = hn::ConvertTo(di, n);
  const auto n1 = hn::ShiftRight<1>(ni);
  const auto n2 = hn::Sub(ni, n1);
  const auto bias = hn::Set(di, 127);
  const V s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const V s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n2, bias)));
  const V y = hn::Mul(hn::Mul(p, s1), s2);
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  return hn::IfThenElse(hn::IsNaN(x_in), x_in, y);  // std::min/max do not keep NaN
#else
  (void)x_in;
  return y;
#endif
}

// 2^x for every lane (flash attention's scores are in base 2), relative error about 1.3e-7: x
// is floored at -100 (2^-100 is still a normal float, so the products that follow meet no
// denormals, and far too small to change a sum that holds a 1) and capped at 128 (+inf); NaN
// becomes 2^-100 (x86's max returns its second operand). 2^f for the fraction f in [-0.5, 0.5]
// is a degree-6 Taylor series of e^(f ln 2); 2^n is applied in two exact halves as in exp.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V exp2(D d, V x) {
  const hn::RebindToSigned<D> di;
  x = hn::Min(hn::Max(x, hn::Set(d, -100.0f)), hn::Set(d, 128.0f));
  const V n = hn::Round(x);
  const V f = hn::Sub(x, n);
  V p = hn::Set(d, 1.5403530393381606e-4f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.3333558146428443e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.6181291076284772e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5504108664821580e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022650695910071e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314718055994531e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
#if HWY_TARGET <= HWY_AVX3
  if constexpr (sizeof(p.raw) == 64) {
    (void)di;
    return V{_mm512_scalef_ps(p.raw, n.raw)};
  }
#endif
  const auto ni = hn::ConvertTo(di, n);
  const auto n1 = hn::ShiftRight<1>(ni);
  const auto bias = hn::Set(di, 127);
  const V s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const V s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::Sub(ni, n1), bias)));
  return hn::Mul(hn::Mul(p, s1), s2);
}

// tanh(x) for every lane, as Cephes' tanhf: an odd polynomial for |x| < 0.625, where
// 1 - 2/(e^2x + 1) would lose digits to cancellation, and that formula elsewhere. Both are
// computed and blended; the error is about 2 ulp everywhere, and +-1 for large |x|.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V tanh(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V ax = hn::Abs(x);
  // Large branch on |x|, sign restored below: 1 - 2 / (e^{2|x|} + 1). 2|x| is capped at 40,
  // where tanh is 1 in float already, so d stays finite.
  const V e = exp(d, hn::Min(hn::Set(d, 40.0f), hn::Add(ax, ax)));
  const V den = hn::Add(e, one);
#if HWY_TARGET <= HWY_AVX3
  // rcp14 plus one Newton step (about 2^-28 relative), much cheaper than a division.
  V r = hn::ApproximateReciprocal(den);
  r = hn::MulAdd(r, hn::NegMulAdd(den, r, one), r);
#else
  // AVX2's rcp is only 12 bits, one Newton step leaves 2^-22: divide instead.
  const V r = hn::Div(one, den);
#endif
  const V big = hn::CopySign(hn::NegMulAdd(hn::Set(d, 2.0f), r, one), x);
  // Small branch: x + x^3 P(x^2).
  const V z = hn::Mul(x, x);
  V p = hn::Set(d, -5.70498872745e-3f);
  p = hn::MulAdd(p, z, hn::Set(d, 2.06390887954e-2f));
  p = hn::MulAdd(p, z, hn::Set(d, -5.37397155531e-2f));
  p = hn::MulAdd(p, z, hn::Set(d, 1.33314422036e-1f));
  p = hn::MulAdd(p, z, hn::Set(d, -3.33332819422e-1f));
  const V small = hn::MulAdd(hn::Mul(p, z), x, x);
  const V y = hn::IfThenElse(hn::Lt(ax, hn::Set(d, 0.625f)), small, big);
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  return hn::IfThenElse(hn::IsNaN(x), x, y);  // std::min/max do not keep NaN
#else
  return y;
#endif
}

// Sum of the lanes in double, in lane order: a row sum kept in a few float vectors loses
// nothing more at the end.
template <class D, class V = hn::Vec<D>>
HWY_INLINE double sum_lanes_pd(D d, V v) {
  HWY_ALIGN float lanes[kMaxLanes];
  hn::Store(v, d, lanes);
  double total = 0.0;
  for (size_t i = 0; i < hn::Lanes(d); ++i) total += static_cast<double>(lanes[i]);
  return total;
}

// Sum of the lanes' products a * b in double, in lane order (each product exact): the
// fallback targets' row sums of products, which a float vector would round.
template <class D, class V = hn::Vec<D>>
HWY_INLINE double dot_lanes_pd(D d, V a, V b) {
  HWY_ALIGN float la[kMaxLanes], lb[kMaxLanes];
  hn::Store(a, d, la);
  hn::Store(b, d, lb);
  double total = 0.0;
  for (size_t i = 0; i < hn::Lanes(d); ++i) total += static_cast<double>(la[i]) * lb[i];
  return total;
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE float sum_lanes(D d, V v) {
  return hn::GetLane(hn::SumOfLanes(d, v));
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE float max_lanes(D d, V v) {
  return hn::GetLane(hn::MaxOfLanes(d, v));
}

// bf16 bits (in the low half of each 32-bit lane) of the floats v, rounded to nearest even;
// NaN becomes a quiet NaN as in bf16_from_f32.
template <class D, class V = hn::Vec<D>>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> bf16_bits(D d, V v) {
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto r = hn::ShiftRight<16>(hn::Add(u, hn::Add(lsb, hn::Set(du, 0x7fffu))));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, r);
}

// The bf16 bits of v rounded with the random bits `random` (convert.h defines stochastic
// rounding element by element); NaN as above.
template <class D, class V = hn::Vec<D>, class VU = hn::Vec<hn::RebindToUnsigned<D>>>
HWY_INLINE VU bf16_stochastic_bits(D d, V v, VU random) {
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, v);
  const auto r = hn::ShiftRight<16>(hn::Add(u, hn::ShiftRight<16>(random)));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, r);
}

// Stores the low 16 bits of each 32-bit lane (values below 2^16) to p.
template <class D, class VU>
HWY_INLINE void store_u16(D d, VU bits, uint16_t* p) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint16_t, D> d16;
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, bits)), d16, p);
}

// Lanes(d) elements of storage type S at p, widened to f32.
template <DType S, class D>
HWY_INLINE hn::Vec<D> load(D d, const half::Storage<S>* p) {
  if constexpr (S == DType::f32) {
    return hn::LoadU(d, p);
  } else if constexpr (S == DType::bf16) {
    const hn::RebindToUnsigned<D> du;
    const hn::Rebind<uint16_t, D> d16;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
  } else {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
    HWY_ALIGN float lanes[kMaxLanes];
    for (size_t i = 0; i < hn::Lanes(d); ++i) lanes[i] = f32_from_f16(p[i]);
    return hn::Load(d, lanes);
#else
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#endif
  }
}

// Stores the Lanes(d) floats v to p as storage type S, rounding to nearest even.
template <DType S, class D>
HWY_INLINE void store(D d, hn::Vec<D> v, half::Storage<S>* p) {
  if constexpr (S == DType::f32) {
    hn::StoreU(v, d, p);
  } else if constexpr (S == DType::bf16) {
    store_u16(d, bf16_bits(d, v), p);
  } else {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
    HWY_ALIGN float lanes[kMaxLanes];
    hn::Store(v, d, lanes);
    for (size_t i = 0; i < hn::Lanes(d); ++i) p[i] = f16_from_f32(lanes[i]);
#else
    // F16C's vcvtps2ph with the immediate 0 (plus no-exceptions): round to nearest even.
    const hn::Rebind<hwy::float16_t, D> dh;
    hn::StoreU(hn::DemoteTo(dh, v), dh, reinterpret_cast<hwy::float16_t*>(p));
#endif
  }
}

// The first n < Lanes(d) elements at p, the other lanes 0; memory past p + n is not touched.
// Tails go through a small buffer so that every lane of a row is computed by the same code.
template <DType S, class D>
HWY_INLINE hn::Vec<D> load_n(D d, const half::Storage<S>* p, int64_t n) {
  HWY_ALIGN half::Storage<S> buf[kMaxLanes] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(half::Storage<S>));
  return load<S>(d, buf);
}

// Stores the first n < Lanes(d) lanes of v to p.
template <DType S, class D>
HWY_INLINE void store_n(D d, hn::Vec<D> v, half::Storage<S>* p, int64_t n) {
  HWY_ALIGN half::Storage<S> buf[kMaxLanes];
  store<S>(d, v, buf);
  std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(half::Storage<S>));
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MEMFIT_KERNELS_CPU_SIMD_INL_H_ toggle
