// Lion and 8-bit Lion: the per-element update (one source for every SIMD target, simd.h) and the loops over chunks
// (FP32 momentum) or quantisation blocks (8-bit momentum).
#include "memfit/kernels/cpu/lion.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/lion.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

#ifndef MEMFIT_KERNELS_CPU_LION_COEFFS_
#define MEMFIT_KERNELS_CPU_LION_COEFFS_
namespace memfit::kernels::lion_detail {
struct LionCoeffs {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, decay, grad_scale;
};

inline LionCoeffs make_coeffs(const LionHyper& h, float grad_scale) {
  return {h.lr,      h.beta1, h.beta2, 1.0f - h.beta1, 1.0f - h.beta2, 1.0f - h.lr * h.weight_decay,
          grad_scale};
}

}  // namespace memfit::kernels::lion_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

void LionApply(float* p, const float* g, float* m, int64_t n, const lion_detail::LionCoeffs& c) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF b1 = hn::Set(d, c.beta1), b2 = hn::Set(d, c.beta2);
  const VF omb1 = hn::Set(d, c.one_minus_beta1), omb2 = hn::Set(d, c.one_minus_beta2);
  const VF decay = hn::Set(d, c.decay), scale = hn::Set(d, c.grad_scale);
  const VF lr = hn::Set(d, c.lr), neg_lr = hn::Set(d, -c.lr);
  const VF zero = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF gi = hn::Mul(hn::LoadU(d, g + i), scale);
    const VF mi = hn::LoadU(d, m + i);
    const VF ci = hn::MulAdd(b1, mi, hn::Mul(omb1, gi));
    // -lr * sign(c): -lr where c > 0, +lr where c < 0, 0 elsewhere (0 and NaN).
    const VF upd = hn::IfThenElse(hn::Gt(ci, zero), neg_lr, hn::IfThenElseZero(hn::Lt(ci, zero), lr));
    hn::StoreU(hn::MulAdd(hn::LoadU(d, p + i), decay, upd), d, p + i);
    hn::StoreU(hn::MulAdd(b2, mi, hn::Mul(omb2, gi)), d, m + i);
  }
  for (; i < n; ++i) {
    float gi = g[i] * c.grad_scale;
    float ci = c.beta1 * m[i] + c.one_minus_beta1 * gi;
    float sign = static_cast<float>((ci > 0.0f) - (ci < 0.0f));
    p[i] = p[i] * c.decay - c.lr * sign;
    m[i] = c.beta2 * m[i] + c.one_minus_beta2 * gi;
  }
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>

#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(LionApply);

namespace {
using lion_detail::LionCoeffs;
using lion_detail::make_coeffs;

void lion_apply(float* p, const float* g, float* m, int64_t n, const LionCoeffs& c) {
  MEMFIT_SIMD_DISPATCH(LionApply)(p, g, m, n, c);
}

void check_param_grad(const Tensor& param, const Tensor& grad, const char* op) {
  expect_any_shape(param, op, "param", DType::f32);
  expect_tensor(grad, op, "grad", param.shape(), DType::f32);
}

}  // namespace

void lion_update(Tensor& param, const Tensor& grad, Tensor& m, const LionHyper& h,
                 float grad_scale) {
  KernelScope timed("lion_update");
  const char* op = "lion";
  check_param_grad(param, grad, op);
  expect_tensor(m, op, "m", param.shape(), DType::f32);
  const LionCoeffs c = make_coeffs(h, grad_scale);
  const int64_t n = param.numel();
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* mp = m.data<float>();
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t off = k * kChunk;
    lion_apply(p + off, g + off, mp + off, std::min(kChunk, n - off), c);
  }
}

void lion8bit_update(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax,
                     const LionHyper& h, float grad_scale) {
  KernelScope timed("lion8bit_update");
  const char* op = "lion8bit";
  check_param_grad(param, grad, op);
  const int64_t n = param.numel(), blocks = quant_blocks(n);
  expect_tensor(m_codes, op, "m_codes", {n}, DType::i8);
  expect_tensor(m_absmax, op, "m_absmax", {blocks}, DType::f32);
  const LionCoeffs c = make_coeffs(h, grad_scale);
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  uint8_t* mq = reinterpret_cast<uint8_t*>(m_codes.data<int8_t>());
  float* ma = m_absmax.data<float>();
  const QuantMap& smap = signed_dynamic_map();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t off = b * kQuantBlock, nb = std::min(kQuantBlock, n - off);
    alignas(64) float m[kQuantBlock];
    dequantize_block(mq + off, nb, ma[b], smap, m);
    lion_apply(p + off, g + off, m, nb, c);
    ma[b] = quantize_block(m, nb, smap, mq + off);
  }
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
