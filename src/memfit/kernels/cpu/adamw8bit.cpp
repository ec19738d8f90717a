// 8-bit AdamW: the per-element AdamW arithmetic (one source for every SIMD target, simd.h) and the block loop that
// dequantises, updates and requantises. See Note [8-bit optimizers].
#include "memfit/kernels/cpu/adamw8bit.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/adamw8bit.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "memfit/kernels/cpu/simd-inl.h"

#ifndef MEMFIT_KERNELS_CPU_ADAMW8BIT_COEFFS_
#define MEMFIT_KERNELS_CPU_ADAMW8BIT_COEFFS_
namespace memfit::kernels::adamw8bit_detail {
// Step constants, as torch.optim.AdamW computes them:
// p = p * (1 - lr wd) - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
struct AdamCoeffs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps, decay, grad_scale;
};
}  // namespace memfit::kernels::adamw8bit_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

// AdamW on n elements with FP32 moments, in place.
void AdamwApply(float* p, const float* g, float* m, float* v, int64_t n,
                const adamw8bit_detail::AdamCoeffs& c) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF b1 = hn::Set(d, c.beta1), b2 = hn::Set(d, c.beta2);
  const VF omb1 = hn::Set(d, c.one_minus_beta1), omb2 = hn::Set(d, c.one_minus_beta2);
  const VF step = hn::Set(d, c.step_size), isb2 = hn::Set(d, c.inv_sqrt_bc2);
  const VF eps = hn::Set(d, c.eps), decay = hn::Set(d, c.decay);
  const VF scale = hn::Set(d, c.grad_scale);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF gi = hn::Mul(hn::LoadU(d, g + i), scale);
    const VF mi = hn::MulAdd(b1, hn::LoadU(d, m + i), hn::Mul(omb1, gi));
    const VF vi = hn::MulAdd(b2, hn::LoadU(d, v + i), hn::Mul(omb2, hn::Mul(gi, gi)));
    const VF denom = hn::MulAdd(hn::Sqrt(vi), isb2, eps);
    const VF pi = hn::NegMulAdd(step, hn::Div(mi, denom), hn::Mul(hn::LoadU(d, p + i), decay));
    hn::StoreU(mi, d, m + i);
    hn::StoreU(vi, d, v + i);
    hn::StoreU(pi, d, p + i);
  }
  for (; i < n; ++i) {
    float gi = g[i] * c.grad_scale;
    float mi = c.beta1 * m[i] + c.one_minus_beta1 * gi;
    float vi = c.beta2 * v[i] + c.one_minus_beta2 * (gi * gi);
    float denom = std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * c.decay - c.step_size * (mi / denom);
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
HWY_EXPORT(AdamwApply);

namespace {
using adamw8bit_detail::AdamCoeffs;

AdamCoeffs make_coeffs(const AdamWHyper& h, int64_t t, float grad_scale, const char* op) {
  MEMFIT_CHECK(t >= 1, op, "step count t must start at 1, got {}", t);
  double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(t));
  double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(t));
  return {h.beta1,
          h.beta2,
          1.0f - h.beta1,
          1.0f - h.beta2,
          static_cast<float>(h.lr / bc1),
          static_cast<float>(1.0 / std::sqrt(bc2)),
          h.eps,
          1.0f - h.lr * h.weight_decay,
          grad_scale};
}

void adamw_apply(float* p, const float* g, float* m, float* v, int64_t n, const AdamCoeffs& c) {
  MEMFIT_SIMD_DISPATCH(AdamwApply)(p, g, m, v, n, c);
}

void check_param_grad(const Tensor& param, const Tensor& grad, const char* op) {
  expect_any_shape(param, op, "param", DType::f32);
  expect_tensor(grad, op, "grad", param.shape(), DType::f32);
}

}  // namespace

void adamw8bit_update(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax,
                      Tensor& v_codes, Tensor& v_absmax, const AdamWHyper& h, int64_t t,
                      float grad_scale) {
  const char* op = "adamw8bit";
  check_param_grad(param, grad, op);
  const int64_t n = param.numel(), blocks = quant_blocks(n);
  expect_tensor(m_codes, op, "m_codes", {n}, DType::i8);
  expect_tensor(v_codes, op, "v_codes", {n}, DType::i8);
  expect_tensor(m_absmax, op, "m_absmax", {blocks}, DType::f32);
  expect_tensor(v_absmax, op, "v_absmax", {blocks}, DType::f32);
  const AdamCoeffs c = make_coeffs(h, t, grad_scale, op);

  float* p = param.data<float>();
  const float* g = grad.data<float>();
  uint8_t* mq = reinterpret_cast<uint8_t*>(m_codes.data<int8_t>());
  uint8_t* vq = reinterpret_cast<uint8_t*>(v_codes.data<int8_t>());
  float* ma = m_absmax.data<float>();
  float* va = v_absmax.data<float>();
  const QuantMap& smap = signed_dynamic_map();
  const QuantMap& umap = unsigned_dynamic_map();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t off = b * kQuantBlock, nb = std::min(kQuantBlock, n - off);
    alignas(64) float m[kQuantBlock], v[kQuantBlock];
    dequantize_block(mq + off, nb, ma[b], smap, m);
    dequantize_block(vq + off, nb, va[b], umap, v);
    adamw_apply(p + off, g + off, m, v, nb, c);
    ma[b] = quantize_block(m, nb, smap, mq + off);
    va[b] = quantize_block(v, nb, umap, vq + off);
  }
}

void adamw8bit_update_f32(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                          const AdamWHyper& h, int64_t t, float grad_scale) {
  const char* op = "adamw8bit_f32";
  check_param_grad(param, grad, op);
  expect_tensor(m, op, "m", param.shape(), DType::f32);
  expect_tensor(v, op, "v", param.shape(), DType::f32);
  const AdamCoeffs c = make_coeffs(h, t, grad_scale, op);
  const int64_t n = param.numel();
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t off = k * kChunk;
    adamw_apply(p + off, g + off, mp + off, vp + off, std::min(kChunk, n - off), c);
  }
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
