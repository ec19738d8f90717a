// GELU (tanh form) forward and backward over the MLP's (B*T, 4C) activation, the largest
// element-wise op of a GPT-2 step. The formulas and their order of operations follow PyTorch's
// CPU kernel (0.5 x (1 + tanh(inner)), and its derivative written out the same way), so the
// two agree to a few ulp; the tanh is vec::tanh under AVX-512 and std::tanh otherwise.
// Every tensor may be f32, bf16 or f16 (mixed precision keeps the MLP's pre-activation in
// bf16): values are widened on load, computed in f32 and rounded once on store.
#include "memfit/kernels/cpu/gelu.h"

#include <cmath>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/half_vec.h"
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

// out = gelu(x) over [begin, end): loads widen and stores round as the storage types say;
// the f32 instance is the FP32 kernel.
template <DType X, DType O>
void forward_range(half::Storage<O>* o, const half::Storage<X>* x, int64_t begin, int64_t end) {
  int64_t i = begin;
#if defined(__AVX512F__)
  for (; i + 16 <= end; i += 16) half::store16<O>(o + i, gelu_vec(half::load16<X>(x + i)));
  if (i < end) {
    const __mmask16 m = vec::tail_mask(end - i);
    half::mask_store16<O>(o + i, m, gelu_vec(half::maskz_load16<X>(m, x + i)));
    return;
  }
#endif
  for (; i < end; ++i) half::store1<O>(o + i, gelu_scalar(half::load1<X>(x + i)));
}

template <DType X, DType G, DType D>
void backward_range(half::Storage<D>* dx, const half::Storage<X>* x, const half::Storage<G>* dy,
                    int64_t begin, int64_t end) {
  int64_t i = begin;
#if defined(__AVX512F__)
  for (; i + 16 <= end; i += 16) {
    const __m512 g = gelu_grad_vec(half::load16<X>(x + i));
    half::store16<D>(dx + i, _mm512_mul_ps(g, half::load16<G>(dy + i)));
  }
  if (i < end) {
    const __mmask16 m = vec::tail_mask(end - i);
    const __m512 g = gelu_grad_vec(half::maskz_load16<X>(m, x + i));
    half::mask_store16<D>(dx + i, m, _mm512_mul_ps(g, half::maskz_load16<G>(m, dy + i)));
    return;
  }
#endif
  for (; i < end; ++i)
    half::store1<D>(dx + i, gelu_grad_scalar(half::load1<X>(x + i)) * half::load1<G>(dy + i));
}

// t must be defined, contiguous, of f32, bf16 or f16, and of `shape` when given.
void expect_float(const Tensor& t, std::string_view op, std::string_view name,
                  const Shape* shape = nullptr) {
  MEMFIT_CHECK(t.defined(), op, "{} is undefined", name);
  MEMFIT_CHECK_DTYPE(half::is_float_type(t.dtype()), op, "{} must be f32, bf16 or f16, got {} {}",
                     name, dtype_name(t.dtype()), t.shape());
  if (shape) expect_tensor(t, op, name, *shape, t.dtype());
  else expect_any_shape(t, op, name, t.dtype());
}

}  // namespace

void gelu_forward(Tensor& out, const Tensor& inp) {
  constexpr std::string_view op = "gelu_forward";
  expect_float(inp, op, "inp");
  expect_float(out, op, "out", &inp.shape());
  half::dispatch(inp.dtype(), [&](auto xt) {
    half::dispatch(out.dtype(), [&](auto ot) {
      constexpr DType X = decltype(xt)::value, O = decltype(ot)::value;
      auto* o = static_cast<half::Storage<O>*>(out.raw_data());
      const auto* x = static_cast<const half::Storage<X>*>(inp.raw_data());
      parallel_ranges(inp.numel(),
                      [&](int64_t begin, int64_t end) { forward_range<X, O>(o, x, begin, end); });
    });
  });
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  constexpr std::string_view op = "gelu_backward";
  expect_float(inp, op, "inp");
  expect_float(dout, op, "dout", &inp.shape());
  expect_float(dinp, op, "dinp", &inp.shape());
  // In place needs equal element sizes: a narrower dinp over a wider dout would overwrite
  // elements that another thread has yet to read.
  MEMFIT_CHECK_DTYPE(dinp.raw_data() != dout.raw_data() || dinp.dtype() == dout.dtype(), op,
                     "dinp ({}) may alias dout ({}) only when their dtypes match",
                     dtype_name(dinp.dtype()), dtype_name(dout.dtype()));
  half::dispatch(inp.dtype(), [&](auto xt) {
    half::dispatch(dout.dtype(), [&](auto gt) {
      half::dispatch(dinp.dtype(), [&](auto dt) {
        constexpr DType X = decltype(xt)::value, G = decltype(gt)::value, D = decltype(dt)::value;
        auto* dx = static_cast<half::Storage<D>*>(dinp.raw_data());
        const auto* x = static_cast<const half::Storage<X>*>(inp.raw_data());
        const auto* dy = static_cast<const half::Storage<G>*>(dout.raw_data());
        // dinp may alias dout: each element is read before it is written, by the same thread.
        parallel_ranges(inp.numel(), [&](int64_t begin, int64_t end) {
          backward_range<X, G, D>(dx, x, dy, begin, end);
        });
      });
    });
  });
}

}  // namespace memfit::kernels
