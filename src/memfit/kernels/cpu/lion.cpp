// Lion and 8-bit Lion: the per-element update (AVX-512 and portable) and the loops over chunks
// (FP32 momentum) or quantisation blocks (8-bit momentum).
#include "memfit/kernels/cpu/lion.h"

#include <algorithm>

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

struct LionCoeffs {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, decay, grad_scale;
};

LionCoeffs make_coeffs(const LionHyper& h, float grad_scale) {
  return {h.lr,      h.beta1, h.beta2, 1.0f - h.beta1, 1.0f - h.beta2, 1.0f - h.lr * h.weight_decay,
          grad_scale};
}

void lion_apply(float* p, const float* g, float* m, int64_t n, const LionCoeffs& c) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 b1 = _mm512_set1_ps(c.beta1), b2 = _mm512_set1_ps(c.beta2);
  const __m512 omb1 = _mm512_set1_ps(c.one_minus_beta1), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 decay = _mm512_set1_ps(c.decay), scale = _mm512_set1_ps(c.grad_scale);
  const __m512 lr = _mm512_set1_ps(c.lr), neg_lr = _mm512_set1_ps(-c.lr);
  const __m512 zero = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), scale);
    __m512 mi = _mm512_loadu_ps(m + i);
    __m512 ci = _mm512_fmadd_ps(b1, mi, _mm512_mul_ps(omb1, gi));
    // -lr * sign(c): -lr where c > 0, +lr where c < 0, 0 elsewhere (0 and NaN).
    __m512 upd = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask(ci, zero, _CMP_GT_OQ),
        _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(ci, zero, _CMP_LT_OQ), lr), neg_lr);
    _mm512_storeu_ps(p + i, _mm512_fmadd_ps(_mm512_loadu_ps(p + i), decay, upd));
    _mm512_storeu_ps(m + i, _mm512_fmadd_ps(b2, mi, _mm512_mul_ps(omb2, gi)));
  }
#endif
  for (; i < n; ++i) {
    float gi = g[i] * c.grad_scale;
    float ci = c.beta1 * m[i] + c.one_minus_beta1 * gi;
    float sign = static_cast<float>((ci > 0.0f) - (ci < 0.0f));
    p[i] = p[i] * c.decay - c.lr * sign;
    m[i] = c.beta2 * m[i] + c.one_minus_beta2 * gi;
  }
}

void check_param_grad(const Tensor& param, const Tensor& grad, const char* op) {
  expect_any_shape(param, op, "param", DType::f32);
  expect_tensor(grad, op, "grad", param.shape(), DType::f32);
}

}  // namespace

void lion_update(Tensor& param, const Tensor& grad, Tensor& m, const LionHyper& h,
                 float grad_scale) {
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
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t off = k * kChunk;
    lion_apply(p + off, g + off, mp + off, std::min(kChunk, n - off), c);
  }
}

void lion8bit_update(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax,
                     const LionHyper& h, float grad_scale) {
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
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t off = b * kQuantBlock, nb = std::min(kQuantBlock, n - off);
    alignas(64) float m[kQuantBlock];
    dequantize_block(mq + off, nb, ma[b], smap, m);
    lion_apply(p + off, g + off, m, nb, c);
    ma[b] = quantize_block(m, nb, smap, mq + off);
  }
}

}  // namespace memfit::kernels
