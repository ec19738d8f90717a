// 8-bit AdamW: the per-element AdamW arithmetic (AVX-512 and portable) and the block loop that
// dequantises, updates and requantises. See Note [8-bit optimizers].
#include "memfit/kernels/cpu/adamw8bit.h"

#include <algorithm>
#include <cmath>

#if defined(__AVX512F__)
// GCC 12.2's AVX-512 headers trip -Wuninitialized on their own "undefined" operands (GCC
// PR105593, fixed in 12.3); the warning is reported at the header's lines, so silence it there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/kernels/cpu/checks.h"

namespace memfit::kernels {

namespace {

// Tensors below this many values run on the calling thread: a parallel region costs more than
// it saves on them (and much more when the cores are shared).
constexpr int64_t kParallelMinElements = 65536;

// Step constants, as torch.optim.AdamW computes them:
// p = p * (1 - lr wd) - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
struct AdamCoeffs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps, decay, grad_scale;
};

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

// AdamW on n elements with FP32 moments, in place.
void adamw_apply(float* p, const float* g, float* m, float* v, int64_t n, const AdamCoeffs& c) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 b1 = _mm512_set1_ps(c.beta1), b2 = _mm512_set1_ps(c.beta2);
  const __m512 omb1 = _mm512_set1_ps(c.one_minus_beta1), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 step = _mm512_set1_ps(c.step_size), isb2 = _mm512_set1_ps(c.inv_sqrt_bc2);
  const __m512 eps = _mm512_set1_ps(c.eps), decay = _mm512_set1_ps(c.decay);
  const __m512 scale = _mm512_set1_ps(c.grad_scale);
  for (; i + 16 <= n; i += 16) {
    __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), scale);
    __m512 mi = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(omb1, gi));
    __m512 vi =
        _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(omb2, _mm512_mul_ps(gi, gi)));
    __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), isb2, eps);
    __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
    pi = _mm512_fnmadd_ps(step, _mm512_div_ps(mi, denom), pi);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, pi);
  }
#endif
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
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
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
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t off = k * kChunk;
    adamw_apply(p + off, g + off, mp + off, vp + off, std::min(kChunk, n - off), c);
  }
}

}  // namespace memfit::kernels
