// Plain SGD: one threaded pass over the parameter, p = p (1 - lr wd) - (lr grad_scale) g, in
// one source for every SIMD target (simd.h).
#include "memfit/kernels/cpu/sgd.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/sgd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

// p * decay - step * g with the product and the difference rounded separately on every target
// (NegMulAdd would fuse them and differ from the scalar tail).
void SgdRange(float* p, const float* g, float decay, float step, int64_t begin, int64_t end) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vd = hn::Set(d, decay), vs = hn::Set(d, step);
  int64_t i = begin;
  for (; i + N <= end; i += N)
    hn::StoreU(hn::Sub(hn::Mul(hn::LoadU(d, p + i), vd), hn::Mul(vs, hn::LoadU(d, g + i))), d,
               p + i);
  for (; i < end; ++i) p[i] = p[i] * decay - step * g[i];
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(SgdRange);

void sgd_update(Tensor& param, const Tensor& grad, float lr, float weight_decay, float grad_scale) {
  KernelScope timed("sgd_update");
  expect_any_shape(param, "sgd", "param", DType::f32);
  expect_tensor(grad, "sgd", "grad", param.shape(), DType::f32);
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  const float decay = 1.0f - lr * weight_decay, step = lr * grad_scale;
  parallel_ranges(param.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(SgdRange)(p, g, decay, step, begin, end);
  });
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
