// The storage types of the kernels' float tensors, element by element: a template over DType
// picks the load (widening bf16 / f16 to f32) and the store (rounding to nearest, ties to
// even, as core/dtype.h defines), and dispatch() turns a run-time dtype into that template
// argument. The vector loads and stores, which give the same bits, are in simd-inl.h.
// Internal to the kernels; the public conversions are in convert.h.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/memory/tensor.h"

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

// x rounded once to D's precision (to nearest even) and kept f32: store1 then load1.
template <DType D>
inline float round1(float x) {
  Storage<D> rounded;
  store1<D>(&rounded, x);
  return load1<D>(&rounded);
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

// A small tensor of f32, bf16 or f16 (a norm's weight or bias) as f32: its own data if it is
// f32, else a widened copy kept in `buf` (C floats, a few KiB: below the pool's notice).
inline const float* as_f32(const Tensor& t, std::vector<float>& buf) {
  if (t.dtype() == DType::f32) return t.data<float>();
  buf.resize(static_cast<size_t>(t.numel()));
  dispatch(t.dtype(), [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const auto* src = static_cast<const Storage<D>*>(t.raw_data());
    for (int64_t i = 0; i < t.numel(); ++i) buf[i] = load1<D>(src + i);
  });
  return buf.data();
}

}  // namespace memfit::kernels::half
