// 8-bit AdamW: the per-element AdamW arithmetic (one source for every SIMD target, simd.h) and the block loop that
// dequantises, updates and requantises. See Note [8-bit optimizers].
#include "memfit/kernels/cpu/adamw8bit.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/adamw8bit.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "memfit/kernels/cpu/simd-inl.h"


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
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(AdamwApply);

using adamw8bit_detail::AdamCoeffs;

AdamCoeffs adam_block_coeffs(const AdamWHyper& h, int64_t t, float grad_scale, const char* op) {
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

void adam_block_apply(float* p, const float* g, float* m, float* v, int64_t n,
                      const AdamCoeffs& c) {
  MEMFIT_SIMD_DISPATCH(AdamwApply)(p, g, m, v, n, c);
}

namespace {

void check_param_grad(const Tensor& param, const Tensor& grad, const char* op, DType dtype) {
  expect_any_shape(param, op, "param", dtype);
  expect_tensor(grad, op, "grad", param.shape(), DType::f32);
}

// Where the updated weights go: f32 in place, or pure bf16 (no master copy) widened into a
// block-sized f32 buffer, updated there and stored with stochastic rounding, element i drawing
// from (step_seed, index0 + i) as adamw_update_stochastic draws (kernels/cpu/convert.h), so any
// split of a tensor into pieces and any thread count round alike.
struct ParamRef {
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
  uint64_t step_seed = 0, index0 = 0;

  // The block [off, off + n) as f32: in place, or widened into buf.
  float* load(int64_t off, int64_t n, float* buf) const {
    if (f32) return f32 + off;
    convert_n(DType::bf16, DType::f32, buf, bf16 + off, n);
    return buf;
  }
  void store(int64_t off, int64_t n, const float* buf) const {
    if (f32) return;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t index = index0 + static_cast<uint64_t>(off + i);
      const uint32_t bits = sr_bits(sr_key(step_seed, static_cast<uint32_t>(index >> 32)),
                                    static_cast<uint32_t>(index));
      bf16[off + i] = bf16_from_f32_stochastic(buf[i], bits);
    }
  }
};

ParamRef param_ref(Tensor& param, int64_t t, uint64_t seed, uint64_t index0) {
  if (param.dtype() == DType::f32) return {param.data<float>(), nullptr, 0, 0};
  // A fresh stream every step, as adamw_update_stochastic's.
  return {nullptr, static_cast<uint16_t*>(param.raw_data()),
          seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(t)), index0};
}

}  // namespace

namespace {
void update_blocks(Tensor& param, DType dtype, const Tensor& grad, Tensor& m_codes,
                   Tensor& m_absmax, Tensor& v_codes, Tensor& v_absmax, const AdamWHyper& h,
                   int64_t t, float grad_scale, uint64_t seed, uint64_t index0) {
  const char* op = dtype == DType::f32 ? "adamw8bit" : "adamw8bit_stochastic";
  check_param_grad(param, grad, op, dtype);
  const int64_t n = param.numel(), blocks = quant_blocks(n);
  expect_tensor(m_codes, op, "m_codes", {n}, DType::i8);
  expect_tensor(v_codes, op, "v_codes", {n}, DType::i8);
  expect_tensor(m_absmax, op, "m_absmax", {blocks}, DType::f32);
  expect_tensor(v_absmax, op, "v_absmax", {blocks}, DType::f32);
  const AdamCoeffs c = adam_block_coeffs(h, t, grad_scale, op);

  const ParamRef p = param_ref(param, t, seed, index0);
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
    alignas(64) float m[kQuantBlock], v[kQuantBlock], w[kQuantBlock];
    dequantize_block(mq + off, nb, ma[b], smap, m);
    dequantize_block(vq + off, nb, va[b], umap, v);
    float* pb = p.load(off, nb, w);
    adam_block_apply(pb, g + off, m, v, nb, c);
    p.store(off, nb, pb);
    ma[b] = quantize_block(m, nb, smap, mq + off);
    va[b] = quantize_block(v, nb, umap, vq + off);
  }
}

void update_f32_state(Tensor& param, DType dtype, const Tensor& grad, Tensor& m, Tensor& v,
                      const AdamWHyper& h, int64_t t, float grad_scale, uint64_t seed,
                      uint64_t index0) {
  const char* op = dtype == DType::f32 ? "adamw8bit_f32" : "adamw8bit_f32_stochastic";
  check_param_grad(param, grad, op, dtype);
  expect_tensor(m, op, "m", param.shape(), DType::f32);
  expect_tensor(v, op, "v", param.shape(), DType::f32);
  const AdamCoeffs c = adam_block_coeffs(h, t, grad_scale, op);
  const int64_t n = param.numel();
  const ParamRef p = param_ref(param, t, seed, index0);
  const float* g = grad.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t off = k * kChunk, nk = std::min(kChunk, n - off);
    alignas(64) float w[kChunk];
    float* pk = p.load(off, nk, w);
    adam_block_apply(pk, g + off, mp + off, vp + off, nk, c);
    p.store(off, nk, pk);
  }
}
}  // namespace

void adamw8bit_update(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax,
                      Tensor& v_codes, Tensor& v_absmax, const AdamWHyper& h, int64_t t,
                      float grad_scale) {
  KernelScope timed("adamw8bit_update");
  update_blocks(param, DType::f32, grad, m_codes, m_absmax, v_codes, v_absmax, h, t, grad_scale,
                0, 0);
}

void adamw8bit_update_stochastic(Tensor& param, const Tensor& grad, Tensor& m_codes,
                                 Tensor& m_absmax, Tensor& v_codes, Tensor& v_absmax,
                                 const AdamWHyper& h, int64_t t, float grad_scale, uint64_t seed,
                                 uint64_t index0) {
  KernelScope timed("adamw8bit_update_stochastic");
  update_blocks(param, DType::bf16, grad, m_codes, m_absmax, v_codes, v_absmax, h, t,
                grad_scale, seed, index0);
}

void adamw8bit_update_f32(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                          const AdamWHyper& h, int64_t t, float grad_scale) {
  KernelScope timed("adamw8bit_update_f32");
  update_f32_state(param, DType::f32, grad, m, v, h, t, grad_scale, 0, 0);
}

void adamw8bit_update_f32_stochastic(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                                     const AdamWHyper& h, int64_t t, float grad_scale,
                                     uint64_t seed, uint64_t index0) {
  KernelScope timed("adamw8bit_update_f32_stochastic");
  update_f32_state(param, DType::bf16, grad, m, v, h, t, grad_scale, seed, index0);
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
