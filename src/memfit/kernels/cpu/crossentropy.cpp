// Softmax cross-entropy over blocks of vocabulary rows: the one kernel of a GPT-2 step whose
// cost is exp, 50k of them per token. Per row, three passes: the max; exp(x - max) with its
// sum (stored back in place when the gradient is wanted); the scale to the gradient. A 200 KB
// row stays in L2 between passes, so memory sees one read and one write. Sums of exp are kept
// in float vectors for 2048 columns at a time and then added in double, which keeps the loss
// within a few 1e-7 of a double-precision reference at V = 50257.
// Logits are f32 in every precision (the softmax over 50k values needs it); mixed precision
// writes their gradient into a separate bf16 / f16 tensor in the last pass.
#include "memfit/kernels/cpu/crossentropy.h"

#include <cmath>
#include <limits>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/half_vec.h"
#include "memfit/kernels/cpu/vec_math.h"

namespace memfit::kernels {
namespace {

float row_max(const float* x, int64_t V) {
#if defined(__AVX512F__)
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
  int64_t i = 0;
  for (; i + 64 <= V; i += 64) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
    m2 = _mm512_max_ps(m2, _mm512_loadu_ps(x + i + 32));
    m3 = _mm512_max_ps(m3, _mm512_loadu_ps(x + i + 48));
  }
  for (; i < V; i += 16)
    m0 = _mm512_max_ps(m0, _mm512_mask_loadu_ps(ninf, vec::tail_mask(V - i), x + i));
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
#else
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) m = x[i] > m ? x[i] : m;
  return m;
#endif
}

// Sum of exp(x - mx) over the row; with kStore, x is overwritten by exp(x - mx).
template <bool kStore>
double row_sum_exp(float* x, int64_t V, float mx) {
  double sum = 0.0;
#if defined(__AVX512F__)
  // Float partial sums over blocks of 2048 columns (64 terms a lane), then double.
  constexpr int64_t kBlock = 2048;
  const __m512 vmx = _mm512_set1_ps(mx);
  for (int64_t b = 0; b < V; b += kBlock) {
    const int64_t end = b + kBlock < V ? b + kBlock : V;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = b;
    for (; i + 32 <= end; i += 32) {
      const __m512 e0 = vec::exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmx));
      const __m512 e1 = vec::exp(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vmx));
      if constexpr (kStore) {
        _mm512_storeu_ps(x + i, e0);
        _mm512_storeu_ps(x + i + 16, e1);
      }
      a0 = _mm512_add_ps(a0, e0);
      a1 = _mm512_add_ps(a1, e1);
    }
    for (; i < end; i += 16) {
      const __mmask16 m = vec::tail_mask(end - i);
      const __m512 e = vec::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmx));
      if constexpr (kStore) _mm512_mask_storeu_ps(x + i, m, e);
      a0 = _mm512_mask_add_ps(a0, m, a0, e);
    }
    sum += vec::reduce_add_pd(_mm512_add_ps(a0, a1));
  }
#else
  for (int64_t i = 0; i < V; ++i) {
    const float e = std::exp(x[i] - mx);
    if constexpr (kStore) x[i] = e;
    sum += e;
  }
#endif
  return sum;
}

// x[0, V) *= s; x[V, Vp) = 0.
void row_scale_pad(float* x, int64_t V, int64_t Vp, float s) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vs = _mm512_set1_ps(s);
  for (; i + 16 <= V; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vs));
#endif
  for (; i < V; ++i) x[i] *= s;
  for (i = V; i < Vp; ++i) x[i] = 0.0f;
}

// out[0, V) = round(x[0, V) * s); out[V, Vp) = 0: row_scale_pad into another storage type.
template <DType D>
void row_scale_pad_into(half::Storage<D>* out, const float* x, int64_t V, int64_t Vp, float s) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vs = _mm512_set1_ps(s);
  for (; i + 16 <= V; i += 16) half::store16<D>(out + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vs));
#endif
  for (; i < V; ++i) half::store1<D>(out + i, x[i] * s);
  for (i = V; i < Vp; ++i) out[i] = 0;
}

struct Dims {
  int64_t R, Vp;
};

Dims check_args(std::string_view op, const Tensor& losses, const Tensor& logits,
                const Tensor& targets, int64_t V) {
  const Shape& ls = expect_any_shape(logits, op, "logits");
  MEMFIT_CHECK_SHAPE(ls.rank() == 2, op, "logits must be (R, Vp), got {}", ls);
  const int64_t R = ls[0], Vp = ls[1];
  MEMFIT_CHECK_SHAPE(0 < V && V <= Vp, op, "V = {} must be in [1, Vp] for logits {}", V, ls);
  expect_tensor(targets, op, "targets", Shape{R}, DType::i32);
  expect_tensor(losses, op, "losses", Shape{R});
  const int32_t* tg = targets.data<int32_t>();
  for (int64_t r = 0; r < R; ++r) {
    MEMFIT_CHECK(tg[r] >= 0 && tg[r] < V, op, "target {} at row {} is outside [0, {})", tg[r], r,
                 V);
  }
  return {R, Vp};
}

// Rows are independent; below this many logits one thread does them all.
constexpr int64_t kParallelLogits = 65536;

}  // namespace

void crossentropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t V) {
  const auto [R, Vp] = check_args("crossentropy_forward", losses, logits, targets, V);
  float* loss = losses.data<float>();
  // Forward reads only; row_sum_exp<false> never writes through this pointer.
  float* x = logits.data<float>();
  const int32_t* tg = targets.data<int32_t>();
#pragma omp parallel for schedule(static) if (R * V > kParallelLogits)
  for (int64_t r = 0; r < R; ++r) {
    float* row = x + r * Vp;
    const float mx = row_max(row, V);
    const double sum = row_sum_exp<false>(row, V, mx);
    loss[r] = static_cast<float>(std::log(sum) + mx - row[tg[r]]);
  }
}

void crossentropy_forward_backward(Tensor& losses, Tensor& logits, const Tensor& targets, int64_t V,
                                   float dloss) {
  const auto [R, Vp] = check_args("crossentropy_forward_backward", losses, logits, targets, V);
  float* loss = losses.data<float>();
  float* x = logits.data<float>();
  const int32_t* tg = targets.data<int32_t>();
#pragma omp parallel for schedule(static) if (R * V > kParallelLogits)
  for (int64_t r = 0; r < R; ++r) {
    float* row = x + r * Vp;
    const int64_t t = tg[r];
    const float mx = row_max(row, V);
    const float xt = row[t];
    const double sum = row_sum_exp<true>(row, V, mx);
    loss[r] = static_cast<float>(std::log(sum) + mx - xt);
    const float et = row[t];
    row_scale_pad(row, V, Vp, static_cast<float>(dloss / sum));
    row[t] = static_cast<float>((et / sum - 1.0) * dloss);
  }
}

void crossentropy_forward_backward(Tensor& losses, Tensor& dlogits, Tensor& logits,
                                   const Tensor& targets, int64_t V, float dloss) {
  constexpr std::string_view op = "crossentropy_forward_backward";
  const auto [R, Vp] = check_args(op, losses, logits, targets, V);
  MEMFIT_CHECK(dlogits.defined(), op, "dlogits is undefined");
  MEMFIT_CHECK_DTYPE(half::is_float_type(dlogits.dtype()), op,
                     "dlogits must be f32, bf16 or f16, got {} {}", dtype_name(dlogits.dtype()),
                     dlogits.shape());
  expect_tensor(dlogits, op, "dlogits", logits.shape(), dlogits.dtype());
  MEMFIT_CHECK(dlogits.raw_data() != logits.raw_data(), op,
               "dlogits must not alias logits (use the in-place overload)");
  float* loss = losses.data<float>();
  float* x = logits.data<float>();
  const int32_t* tg = targets.data<int32_t>();
  half::dispatch(dlogits.dtype(), [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* dx = static_cast<half::Storage<D>*>(dlogits.raw_data());
    // The in-place overload's arithmetic, step for step; only the last pass stores elsewhere.
#pragma omp parallel for schedule(static) if (R * V > kParallelLogits)
    for (int64_t r = 0; r < R; ++r) {
      float* row = x + r * Vp;
      const int64_t t = tg[r];
      const float mx = row_max(row, V);
      const float xt = row[t];
      const double sum = row_sum_exp<true>(row, V, mx);
      loss[r] = static_cast<float>(std::log(sum) + mx - xt);
      const float et = row[t];
      row_scale_pad_into<D>(dx + r * Vp, row, V, Vp, static_cast<float>(dloss / sum));
      half::store1<D>(dx + r * Vp + t, static_cast<float>((et / sum - 1.0) * dloss));
    }
  });
}

}  // namespace memfit::kernels
