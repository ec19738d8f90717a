// Helpers for the mixed-precision kernel tests: tensors of any float dtype filled from doubles
// (rounded to nearest even, so a reference can be run on exactly the values the kernel sees),
// read back as doubles, and the rounding of a double vector to a dtype's precision.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "test_util.h"

namespace memfit::kernels::test {

// x rounded to dtype t (through float first, as a kernel's input would be).
inline double round_to(DType t, double x) {
  const float f = static_cast<float>(x);
  switch (t) {
    case DType::bf16:
      return f32_from_bf16(bf16_from_f32(f));
    case DType::f16:
      return f32_from_f16(f16_from_f32(f));
    default:
      return f;
  }
}

inline std::vector<double> rounded(DType t, std::vector<double> v) {
  for (double& x : v) x = round_to(t, x);
  return v;
}

// Writes v into t (f32, bf16 or f16), rounding each value to nearest even.
inline void copy_in_any(Tensor& t, const std::vector<double>& v) {
  ASSERT_EQ(static_cast<size_t>(t.numel()), v.size());
  if (t.dtype() == DType::f32) return copy_in(t, v);
  auto* p = static_cast<uint16_t*>(t.raw_data());
  for (size_t i = 0; i < v.size(); ++i) {
    const float f = static_cast<float>(v[i]);
    p[i] = t.dtype() == DType::bf16 ? bf16_from_f32(f) : f16_from_f32(f);
  }
}

inline std::vector<double> to_doubles_any(const Tensor& t) {
  if (t.dtype() == DType::f32) return to_doubles(t);
  const auto* p = static_cast<const uint16_t*>(t.raw_data());
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype() == DType::bf16 ? f32_from_bf16(p[i]) : f32_from_f16(p[i]);
  return v;
}

// A new tensor of dtype t holding uniform values from [lo, hi) rounded to t; `values`
// receives what the tensor holds, exactly.
inline Tensor random_any(MemoryPool& pool, Shape shape, DType t, uint32_t seed,
                         std::vector<double>* values = nullptr, double lo = -1.0, double hi = 1.0) {
  Tensor x = make_tensor(pool, shape, t);
  std::vector<double> v =
      rounded(t, random_values(static_cast<size_t>(shape.numel()), seed, lo, hi));
  copy_in_any(x, v);
  if (values) *values = std::move(v);
  return x;
}

// Relative unit roundoff of a storage type: half the distance from 1 to the next value.
inline double unit_roundoff(DType t) {
  return t == DType::bf16 ? 0x1p-8 : t == DType::f16 ? 0x1p-11 : 0x1p-24;
}

// The linear layer as the model runs it on this CPU: oneDNN's own kernels, or widened through
// the f32 GEMM into a pool scratch where matmul_widens(inp's type) (f16; bf16 below AVX-512).
inline Tensor route_scratch(MemoryPool& pool, const Tensor& inp, const Tensor& weight) {
  const int64_t IC = weight.shape()[1], OC = weight.shape()[0];
  int64_t R = 1;  // the leading dims' product (numel / IC fails when IC = 0)
  for (int d = 0; d + 1 < inp.shape().rank(); ++d) R *= inp.shape()[d];
  const size_t bytes = matmul_widened_scratch_bytes(R, IC, OC);
  return make_tensor(pool, {static_cast<int64_t>((bytes + 3) / 4)});
}
inline void routed_forward(MemoryPool& pool, Tensor& out, const Tensor& inp, const Tensor& weight,
                           const Tensor& bias) {
  if (!matmul_widens(inp.dtype())) return matmul_forward(out, inp, weight, bias);
  Tensor scratch = route_scratch(pool, inp, weight);
  matmul_forward_widened(out, inp, weight, bias, scratch);
}
inline void routed_backward(MemoryPool& pool, Tensor& dinp, Tensor& dweight, Tensor& dbias,
                            const Tensor& dout, const Tensor& inp, const Tensor& weight) {
  if (!matmul_widens(inp.dtype())) return matmul_backward(dinp, dweight, dbias, dout, inp, weight);
  Tensor scratch = route_scratch(pool, inp, weight);
  matmul_backward_widened(dinp, dweight, dbias, dout, inp, weight, scratch);
}

// A copy of t converted to dtype d (rounded to nearest even).
inline Tensor as(MemoryPool& pool, const Tensor& t, DType d) {
  Tensor r = make_tensor(pool, t.shape(), d);
  convert(r, t);
  return r;
}

// The same dtype and the same bytes.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace memfit::kernels::test
