// AdamW's element-wise update, written to follow torch.optim.AdamW (single-tensor path)
// operation by operation so that memfit and PyTorch parameters agree to an ulp or two after a
// step, not just to the formula:
//   p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);  v = v b2 + ((1 - b2) g) g;
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) m / denom.
// The scalars are formed in double, as Python does, then rounded to float. The update streams
// four arrays in and three out, so it is memory-bound; divisions stay divisions (as in torch)
// because they are free next to the memory traffic. The mixed-precision variants share the
// arithmetic and differ only in how the weight is loaded and stored (a policy type below).
#include "memfit/kernels/cpu/adamw.h"

#include <cmath>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/half_vec.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/vec_math.h"

namespace memfit::kernels {
namespace {

// The per-step scalars, rounded to float once.
struct Coeffs {
  float grad_scale, decay, w1, b2, c2, bc2_sqrt, eps, neg_step;
};

Coeffs make_coeffs(const AdamWHyper& h, int64_t t, float grad_scale) {
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
  return {grad_scale,
          static_cast<float>(1.0 - lr * static_cast<double>(h.weight_decay)),
          static_cast<float>(1.0 - b1),
          h.beta2,
          static_cast<float>(1.0 - b2),
          static_cast<float>(std::sqrt(bc2)),
          h.eps,
          static_cast<float>(-lr / bc1)};
}

// Where the weights live, as a policy of update_range: load 16 lanes (or one element) of the
// old weight, store the new one. The arithmetic in between is shared by every mode.
struct F32Weights {
  float* p;
#if defined(__AVX512F__)
  __m512 load(int64_t i, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, p + i); }
  void store(int64_t i, __mmask16 m, __m512 x) const { _mm512_mask_storeu_ps(p + i, m, x); }
#endif
  float load1(int64_t i) const { return p[i]; }
  void store1(int64_t i, float x) const { p[i] = x; }
};

// f32 master and its bf16 / f16 working copy, written in the same pass.
template <DType D>
struct MasterWeights {
  float* p;
  half::Storage<D>* w;
#if defined(__AVX512F__)
  __m512 load(int64_t i, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, p + i); }
  void store(int64_t i, __mmask16 m, __m512 x) const {
    _mm512_mask_storeu_ps(p + i, m, x);
    half::mask_store16<D>(w + i, m, x);
  }
#endif
  float load1(int64_t i) const { return p[i]; }
  void store1(int64_t i, float x) const {
    p[i] = x;
    half::store1<D>(w + i, x);
  }
};

// bf16 weights stored with stochastic rounding; element i draws from (seed, index0 + i).
struct StochasticBf16Weights {
  uint16_t* p;
  uint64_t seed, index0;
#if defined(__AVX512F__)
  __m512 load(int64_t i, __mmask16 m) const { return half::maskz_load16<DType::bf16>(m, p + i); }
  void store(int64_t i, __mmask16 m, __m512 x) const {
    const uint64_t first = index0 + static_cast<uint64_t>(i);
    if ((first >> 32) != ((first + 15) >> 32)) {  // lanes across 2^32: element by element
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, x);
      for (int j = 0; j < 16; ++j)
        if (m >> j & 1) store1(i + j, lanes[j]);
      return;
    }
    const __m512i key = _mm512_set1_epi32(static_cast<int>(sr_key(seed, first >> 32)));
    _mm512_mask_cvtepi32_storeu_epi16(
        p + i, m,
        half::bf16_stochastic_bits(x, half::sr_bits16(key, static_cast<uint32_t>(first))));
  }
#endif
  float load1(int64_t i) const { return f32_from_bf16(p[i]); }
  void store1(int64_t i, float x) const {
    const uint64_t idx = index0 + static_cast<uint64_t>(i);
    p[i] = bf16_from_f32_stochastic(
        x, sr_bits(sr_key(seed, static_cast<uint32_t>(idx >> 32)), static_cast<uint32_t>(idx)));
  }
};

template <typename Weights>
void update_range(const Weights& w, const float* g, float* m, float* v, const Coeffs& k,
                  int64_t begin, int64_t end) {
  int64_t i = begin;
#if defined(__AVX512F__)
  const __m512 gs = _mm512_set1_ps(k.grad_scale), decay = _mm512_set1_ps(k.decay);
  const __m512 w1 = _mm512_set1_ps(k.w1), b2 = _mm512_set1_ps(k.b2), c2 = _mm512_set1_ps(k.c2);
  const __m512 bc2s = _mm512_set1_ps(k.bc2_sqrt), eps = _mm512_set1_ps(k.eps);
  const __m512 ns = _mm512_set1_ps(k.neg_step);
  for (; i < end; i += 16) {
    const __mmask16 msk = vec::tail_mask(end - i);
    const __m512 gv = _mm512_mul_ps(_mm512_maskz_loadu_ps(msk, g + i), gs);
    const __m512 pv = _mm512_mul_ps(w.load(i, msk), decay);
    __m512 mv = _mm512_maskz_loadu_ps(msk, m + i);
    mv = _mm512_fmadd_ps(w1, _mm512_sub_ps(gv, mv), mv);
    __m512 vv = _mm512_mul_ps(_mm512_maskz_loadu_ps(msk, v + i), b2);
    vv = _mm512_add_ps(vv, _mm512_mul_ps(_mm512_mul_ps(c2, gv), gv));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), bc2s), eps);
    const __m512 pn = _mm512_add_ps(pv, _mm512_div_ps(_mm512_mul_ps(ns, mv), denom));
    _mm512_mask_storeu_ps(m + i, msk, mv);
    _mm512_mask_storeu_ps(v + i, msk, vv);
    w.store(i, msk, pn);
  }
#else
  for (; i < end; ++i) {
    const float gi = g[i] * k.grad_scale;
    const float pi = w.load1(i) * k.decay;
    const float mi = m[i] + k.w1 * (gi - m[i]);
    const float vi = v[i] * k.b2 + (k.c2 * gi) * gi;
    const float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    m[i] = mi;
    v[i] = vi;
    w.store1(i, pi + (k.neg_step * mi) / denom);
  }
#endif
}

// grad, m and v: f32, as many elements as param; t from 1. param's dtype is checked by the
// caller.
void check_state(std::string_view op, const Tensor& param, const Tensor& grad, const Tensor& m,
                 const Tensor& v, int64_t t) {
  expect_any_shape(param, op, "param", param.dtype());
  expect_any_shape(grad, op, "grad");
  expect_any_shape(m, op, "m");
  expect_any_shape(v, op, "v");
  const int64_t n = param.numel();
  MEMFIT_CHECK_SHAPE(grad.numel() == n && m.numel() == n && v.numel() == n, op,
                     "param {}, grad {}, m {} and v {} must have the same element count",
                     param.shape(), grad.shape(), m.shape(), v.shape());
  MEMFIT_CHECK(t >= 1, op, "step t = {} must count from 1", t);
}

}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& h,
                  int64_t t, float grad_scale) {
  constexpr std::string_view op = "adamw_update";
  expect_any_shape(param, op, "param");
  check_state(op, param, grad, m, v, t);
  const Coeffs k = make_coeffs(h, t, grad_scale);
  const F32Weights w{param.data<float>()};
  float *pm = m.data<float>(), *pv = v.data<float>();
  const float* pg = grad.data<float>();
  parallel_ranges(param.numel(),
                  [&](int64_t begin, int64_t end) { update_range(w, pg, pm, pv, k, begin, end); });
}

void adamw_update_master(Tensor& master, Tensor& working, const Tensor& grad, Tensor& m, Tensor& v,
                         const AdamWHyper& h, int64_t t, float grad_scale) {
  constexpr std::string_view op = "adamw_update_master";
  expect_any_shape(master, op, "master");
  check_state(op, master, grad, m, v, t);
  MEMFIT_CHECK(working.defined(), op, "working is undefined");
  MEMFIT_CHECK_DTYPE(working.dtype() == DType::bf16 || working.dtype() == DType::f16, op,
                     "working must be bf16 or f16, got {} {}", dtype_name(working.dtype()),
                     working.shape());
  expect_any_shape(working, op, "working", working.dtype());
  MEMFIT_CHECK_SHAPE(working.numel() == master.numel(), op,
                     "working {} and master {} must have the same element count", working.shape(),
                     master.shape());
  const Coeffs k = make_coeffs(h, t, grad_scale);
  float *pm = m.data<float>(), *pv = v.data<float>();
  const float* pg = grad.data<float>();
  half::dispatch(working.dtype(), [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    if constexpr (D != DType::f32) {
      const MasterWeights<D> w{master.data<float>(),
                               static_cast<half::Storage<D>*>(working.raw_data())};
      parallel_ranges(master.numel(), [&](int64_t begin, int64_t end) {
        update_range(w, pg, pm, pv, k, begin, end);
      });
    }
  });
}

void adamw_update_stochastic(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                             const AdamWHyper& h, int64_t t, float grad_scale, uint64_t seed,
                             uint64_t index0) {
  constexpr std::string_view op = "adamw_update_stochastic";
  expect_any_shape(param, op, "param", DType::bf16);
  check_state(op, param, grad, m, v, t);
  const Coeffs k = make_coeffs(h, t, grad_scale);
  // A fresh stream every step: the same bits each step would round each element the same way.
  const uint64_t step_seed = seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(t));
  const StochasticBf16Weights w{static_cast<uint16_t*>(param.raw_data()), step_seed, index0};
  float *pm = m.data<float>(), *pv = v.data<float>();
  const float* pg = grad.data<float>();
  parallel_ranges(param.numel(),
                  [&](int64_t begin, int64_t end) { update_range(w, pg, pm, pv, k, begin, end); });
}

}  // namespace memfit::kernels
