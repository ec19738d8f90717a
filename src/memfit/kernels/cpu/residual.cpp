// Element-wise sums over whole activations and gradient slabs. They are memory-bound, so the
// point is one pass, all cores, full-width vectors, and sum_squares in double so a gradient
// norm over 124M parameters is exact to float precision. f32 only for now: a bf16 path adds a
// branch per function on dtype() that widens on load and rounds on store.
// One source for every SIMD target (simd.h); the public functions are at the end.
#include "memfit/kernels/cpu/residual.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/residual.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

void AddRange(float* out, const float* a, const float* b, int64_t begin, int64_t end) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = begin;
  for (; i + N <= end; i += N)
    hn::StoreU(hn::Add(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i);
  if (i < end) {
    const int64_t n = end - i;
    store_n<DType::f32>(
        d, hn::Add(load_n<DType::f32>(d, a + i, n), load_n<DType::f32>(d, b + i, n)), out + i, n);
  }
}

void ScaleRange(float* x, float s, int64_t begin, int64_t end) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vs = hn::Set(d, s);
  int64_t i = begin;
  for (; i + N <= end; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, x + i);
  for (; i < end; ++i) x[i] *= s;  // the same single rounding as the vector lanes
}

// Squares of floats are exact in double; two accumulators hide the add latency.
double SumSquaresRange(const float* x, int64_t begin, int64_t end) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dh;  // as many floats as dd has doubles
  const int64_t N = static_cast<int64_t>(hn::Lanes(dd));
  auto acc0 = hn::Zero(dd), acc1 = hn::Zero(dd);
  int64_t i = begin;
  for (; i + 2 * N <= end; i += 2 * N) {
    const auto lo = hn::PromoteTo(dd, hn::LoadU(dh, x + i));
    const auto hi = hn::PromoteTo(dd, hn::LoadU(dh, x + i + N));
    acc0 = hn::MulAdd(lo, lo, acc0);
    acc1 = hn::MulAdd(hi, hi, acc1);
  }
  double total = hn::GetLane(hn::SumOfLanes(dd, hn::Add(acc0, acc1)));
  for (; i < end; ++i) total += static_cast<double>(x[i]) * x[i];
  return total;
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(AddRange);
HWY_EXPORT(ScaleRange);
HWY_EXPORT(SumSquaresRange);

void residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  KernelScope timed("residual_forward");
  constexpr std::string_view op = "residual_forward";
  const Shape& shape = expect_any_shape(a, op, "a");
  expect_tensor(b, op, "b", shape);
  expect_tensor(out, op, "out", shape);
  float* o = out.data<float>();
  const float *pa = a.data<float>(), *pb = b.data<float>();
  parallel_ranges(a.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(AddRange)(o, pa, pb, begin, end);
  });
}

void add_inplace(Tensor& dst, const Tensor& src) {
  KernelScope timed("add_inplace");
  constexpr std::string_view op = "add_inplace";
  expect_any_shape(dst, op, "dst");
  expect_any_shape(src, op, "src");
  MEMFIT_CHECK_SHAPE(dst.numel() == src.numel(), op, "dst {} and src {} differ in element count",
                     dst.shape(), src.shape());
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  parallel_ranges(dst.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(AddRange)(d, d, s, begin, end);
  });
}

void scale_inplace(Tensor& dst, float s) {
  KernelScope timed("scale_inplace");
  expect_any_shape(dst, "scale_inplace", "dst");
  float* d = dst.data<float>();
  parallel_ranges(dst.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(ScaleRange)(d, s, begin, end);
  });
}

double sum_squares(const Tensor& t) {
  KernelScope timed("sum_squares");
  expect_any_shape(t, "sum_squares", "t");
  const float* x = t.data<float>();
  return parallel_sum(t.numel(), [&](int64_t begin, int64_t end) {
    return MEMFIT_SIMD_DISPATCH(SumSquaresRange)(x, begin, end);
  });
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
