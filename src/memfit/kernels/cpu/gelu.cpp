// GELU (tanh form) forward and backward over the MLP's (B*T, 4C) activation, the largest
// element-wise op of a GPT-2 step. The formulas and their order of operations follow PyTorch's
// CPU kernel (0.5 x (1 + tanh(inner)), and its derivative written out the same way), so the
// two agree to a few ulp; the tanh is vec::tanh under AVX-512 and std::tanh otherwise.
#include "memfit/kernels/cpu/gelu.h"

#include <cmath>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/vec_math.h"

namespace memfit::kernels {
namespace {

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kKappa = 0.044715f;

inline float gelu_scalar(float x) {
  const float inner = kBeta * (x + kKappa * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

inline float gelu_grad_scalar(float x) {
  const float x_sq = x * x;
  const float t = std::tanh(kBeta * (x + kKappa * x_sq * x));
  const float left = 0.5f * x;
  const float left_derivative = 0.5f * (1.0f + t);
  const float right_derivative = left * (1.0f - t * t) * (kBeta * (1.0f + 3.0f * kKappa * x_sq));
  return left_derivative + right_derivative;
}

#if defined(__AVX512F__)
inline __m512 gelu_vec(__m512 x) {
  const __m512 x_sq = _mm512_mul_ps(x, x);
  const __m512 inner = _mm512_mul_ps(
      _mm512_set1_ps(kBeta), _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(kKappa), x_sq), x, x));
  const __m512 t = vec::tanh(inner);
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x),
                       _mm512_add_ps(_mm512_set1_ps(1.0f), t));
}

inline __m512 gelu_grad_vec(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
  const __m512 x_sq = _mm512_mul_ps(x, x);
  const __m512 inner = _mm512_mul_ps(
      _mm512_set1_ps(kBeta), _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(kKappa), x_sq), x, x));
  const __m512 t = vec::tanh(inner);
  const __m512 left = _mm512_mul_ps(half, x);
  const __m512 left_derivative = _mm512_mul_ps(half, _mm512_add_ps(one, t));
  const __m512 inner_derivative = _mm512_mul_ps(
      _mm512_set1_ps(kBeta), _mm512_fmadd_ps(_mm512_set1_ps(3.0f * kKappa), x_sq, one));
  const __m512 tanh_derivative = _mm512_fnmadd_ps(t, t, one);
  return _mm512_fmadd_ps(_mm512_mul_ps(left, tanh_derivative), inner_derivative, left_derivative);
}
#endif

}  // namespace

void gelu_forward(Tensor& out, const Tensor& inp) {
  constexpr std::string_view op = "gelu_forward";
  const Shape& shape = expect_any_shape(inp, op, "inp");
  expect_tensor(out, op, "out", shape);
  float* o = out.data<float>();
  const float* x = inp.data<float>();
  parallel_ranges(inp.numel(), [&](int64_t begin, int64_t end) {
    int64_t i = begin;
#if defined(__AVX512F__)
    for (; i + 16 <= end; i += 16) _mm512_storeu_ps(o + i, gelu_vec(_mm512_loadu_ps(x + i)));
    if (i < end) {
      const __mmask16 m = vec::tail_mask(end - i);
      _mm512_mask_storeu_ps(o + i, m, gelu_vec(_mm512_maskz_loadu_ps(m, x + i)));
      return;
    }
#endif
    for (; i < end; ++i) o[i] = gelu_scalar(x[i]);
  });
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  constexpr std::string_view op = "gelu_backward";
  const Shape& shape = expect_any_shape(inp, op, "inp");
  expect_tensor(dout, op, "dout", shape);
  expect_tensor(dinp, op, "dinp", shape);
  float* dx = dinp.data<float>();
  const float *x = inp.data<float>(), *dy = dout.data<float>();
  // dinp may alias dout: each element is read before it is written, and by the same thread.
  parallel_ranges(inp.numel(), [&](int64_t begin, int64_t end) {
    int64_t i = begin;
#if defined(__AVX512F__)
    for (; i + 16 <= end; i += 16) {
      const __m512 g = gelu_grad_vec(_mm512_loadu_ps(x + i));
      _mm512_storeu_ps(dx + i, _mm512_mul_ps(g, _mm512_loadu_ps(dy + i)));
    }
    if (i < end) {
      const __mmask16 m = vec::tail_mask(end - i);
      const __m512 g = gelu_grad_vec(_mm512_maskz_loadu_ps(m, x + i));
      _mm512_mask_storeu_ps(dx + i, m, _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, dy + i)));
      return;
    }
#endif
    for (; i < end; ++i) dx[i] = gelu_grad_scalar(x[i]) * dy[i];
  });
}

}  // namespace memfit::kernels
