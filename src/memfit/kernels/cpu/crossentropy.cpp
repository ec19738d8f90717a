// Softmax cross-entropy over blocks of vocabulary rows: the one kernel of a GPT-2 step whose
// cost is exp, 50k of them per token. Per row, three passes: the max; exp(x - max) with its
// sum (stored back in place when the gradient is wanted); the scale to the gradient. A 200 KB
// row stays in L2 between passes, so memory sees one read and one write. Sums of exp are kept
// in float vectors for 2048 columns at a time and then added in double, which keeps the loss
// within a few 1e-7 of a double-precision reference at V = 50257.
// Logits are f32 in every precision (the softmax over 50k values needs it); mixed precision
// writes their gradient into a separate bf16 / f16 tensor in the last pass.
// One source for every SIMD target (simd.h); the public functions are at the end.
#include "memfit/kernels/cpu/crossentropy.h"
#include "memfit/kernels/cpu/crossentropy_rows.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/crossentropy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <limits>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

float CeRowMax(const float* x, int64_t V) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
  VF m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
  int64_t i = 0;
  for (; i + 4 * N <= V; i += 4 * N) {
    m0 = hn::Max(m0, hn::LoadU(d, x + i));
    m1 = hn::Max(m1, hn::LoadU(d, x + i + N));
    m2 = hn::Max(m2, hn::LoadU(d, x + i + 2 * N));
    m3 = hn::Max(m3, hn::LoadU(d, x + i + 3 * N));
  }
  for (; i + N <= V; i += N) m0 = hn::Max(m0, hn::LoadU(d, x + i));
  float m = max_lanes(d, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3)));
  for (; i < V; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Sum of exp(x - mx) over the row; with store, x is overwritten by exp(x - mx). Float partial
// sums over blocks of 2048 columns (64 terms a lane on AVX3), then double.
double CeRowSumExp(float* x, int64_t V, float mx, bool store) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kBlock = 2048;
  const VF vmx = hn::Set(d, mx);
  double sum = 0.0;
  for (int64_t b = 0; b < V; b += kBlock) {
    const int64_t end = b + kBlock < V ? b + kBlock : V;
    VF a0 = hn::Zero(d), a1 = hn::Zero(d);
    int64_t i = b;
    for (; i + 2 * N <= end; i += 2 * N) {
      const VF e0 = exp(d, hn::Sub(hn::LoadU(d, x + i), vmx));
      const VF e1 = exp(d, hn::Sub(hn::LoadU(d, x + i + N), vmx));
      if (store) {
        hn::StoreU(e0, d, x + i);
        hn::StoreU(e1, d, x + i + N);
      }
      a0 = hn::Add(a0, e0);
      a1 = hn::Add(a1, e1);
    }
    for (; i < end; i += N) {
      const int64_t n = end - i < N ? end - i : N;
      const VF e = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(n)),
                                      exp(d, hn::Sub(load_n<DType::f32>(d, x + i, n), vmx)));
      if (store) store_n<DType::f32>(d, e, x + i, n);
      a0 = hn::Add(a0, e);
    }
    sum += sum_lanes_pd(d, hn::Add(a0, a1));
  }
  return sum;
}

// out[0, V) = round(x[0, V) * s); out[V, Vp) = 0. out may be x (f32).
template <DType D>
void row_scale_pad(half::Storage<D>* out, const float* x, int64_t V, int64_t Vp, float s) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vs = hn::Set(d, s);
  int64_t i = 0;
  for (; i + N <= V; i += N) store<D>(d, hn::Mul(hn::LoadU(d, x + i), vs), out + i);
  for (; i < V; ++i) half::store1<D>(out + i, x[i] * s);
  for (i = V; i < Vp; ++i) out[i] = 0;
}

// As row_scale_pad<D> followed by widening its output exactly into x, in place: each product
// rounded to D's precision and kept f32.
template <DType D>
void row_scale_round_pad(float* x, int64_t V, int64_t Vp, float s) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vs = hn::Set(d, s);
  HWY_ALIGN half::Storage<D> buf[kMaxLanes];
  int64_t i = 0;
  for (; i + N <= V; i += N) {
    store<D>(d, hn::Mul(hn::LoadU(d, x + i), vs), buf);
    hn::StoreU(load<D>(d, buf), d, x + i);
  }
  for (; i < V; ++i) x[i] = half::round1<D>(x[i] * s);
  for (i = V; i < Vp; ++i) x[i] = 0;
}

void CeRowScalePad(DType t, void* out, const float* x, int64_t V, int64_t Vp, float s) {
  half::dispatch(t, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    row_scale_pad<D>(static_cast<half::Storage<D>*>(out), x, V, Vp, s);
  });
}

void CeRowScaleRoundPad(DType t, float* x, int64_t V, int64_t Vp, float s) {
  half::dispatch(t, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    if constexpr (D == DType::f32)
      row_scale_pad<D>(x, x, V, Vp, s);
    else
      row_scale_round_pad<D>(x, V, Vp, s);
  });
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(CeRowMax);
HWY_EXPORT(CeRowSumExp);
HWY_EXPORT(CeRowScalePad);
HWY_EXPORT(CeRowScaleRoundPad);

namespace {

float row_max(const float* x, int64_t V) { return MEMFIT_SIMD_DISPATCH(CeRowMax)(x, V); }

template <bool kStore>
double row_sum_exp(float* x, int64_t V, float mx) {
  return MEMFIT_SIMD_DISPATCH(CeRowSumExp)(x, V, mx, kStore);
}

void row_scale_round_pad(DType round_to, float* x, int64_t V, int64_t Vp, float s) {
  MEMFIT_SIMD_DISPATCH(CeRowScaleRoundPad)(round_to, x, V, Vp, s);
}

template <DType D>
void row_scale_pad_into(half::Storage<D>* out, const float* x, int64_t V, int64_t Vp, float s) {
  MEMFIT_SIMD_DISPATCH(CeRowScalePad)(D, out, x, V, Vp, s);
}

// Read into named locals, not a structured binding: clang cannot capture one in an OpenMP
// region.
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

// The mask's bytes (null without one), after checking it is (R) u8 of 0s and 1s.
const uint8_t* check_mask(std::string_view op, const Tensor* mask, int64_t R) {
  if (mask == nullptr) return nullptr;
  expect_tensor(*mask, op, "mask", Shape{R}, DType::u8);
  const uint8_t* m = mask->data<uint8_t>();
  for (int64_t r = 0; r < R; ++r)
    MEMFIT_CHECK(m[r] <= 1, op, "mask {} at row {} is not 0 or 1", int(m[r]), r);
  return m;
}

}  // namespace

namespace ce_rows {
float row_max(const float* x, int64_t n) { return kernels::row_max(x, n); }
double row_sum_exp(float* x, int64_t n, float mx, bool store) {
  return store ? kernels::row_sum_exp<true>(x, n, mx) : kernels::row_sum_exp<false>(x, n, mx);
}
void row_scale_round_pad(DType round_to, float* x, int64_t n, int64_t width, float s) {
  kernels::row_scale_round_pad(round_to, x, n, width, s);
}
float round_one(DType round_to, float v) {
  return half::dispatch(round_to, [&](auto tag) { return half::round1<decltype(tag)::value>(v); });
}
}  // namespace ce_rows

void crossentropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t V,
                          const Tensor* mask) {
  KernelScope timed("crossentropy_forward");
  const auto dims = check_args("crossentropy_forward", losses, logits, targets, V);
  const int64_t R = dims.R, Vp = dims.Vp;
  const uint8_t* keep = check_mask("crossentropy_forward", mask, R);
  float* loss = losses.data<float>();
  // Forward reads only; row_sum_exp<false> never writes through this pointer.
  float* x = logits.data<float>();
  const int32_t* tg = targets.data<int32_t>();
#pragma omp parallel for schedule(static) if (R * V > kParallelGrain)
  for (int64_t r = 0; r < R; ++r) {
    if (keep && !keep[r]) {
      loss[r] = 0;
      continue;
    }
    float* row = x + r * Vp;
    const float mx = row_max(row, V);
    const double sum = row_sum_exp<false>(row, V, mx);
    loss[r] = static_cast<float>(std::log(sum) + mx - row[tg[r]]);
  }
}

void crossentropy_forward_backward(Tensor& losses, Tensor& logits, const Tensor& targets, int64_t V,
                                   float dloss, DType round_to, const Tensor* mask) {
  KernelScope timed("crossentropy_forward_backward");
  constexpr std::string_view op = "crossentropy_forward_backward";
  const auto dims = check_args(op, losses, logits, targets, V);
  const int64_t R = dims.R, Vp = dims.Vp;
  const uint8_t* keep = check_mask(op, mask, R);
  MEMFIT_CHECK_DTYPE(half::is_float_type(round_to), op, "round_to must be f32, bf16 or f16, got {}",
                     dtype_name(round_to));
  float* loss = losses.data<float>();
  float* x = logits.data<float>();
  const int32_t* tg = targets.data<int32_t>();
#pragma omp parallel for schedule(static) if (R * V > kParallelGrain)
  for (int64_t r = 0; r < R; ++r) {
    float* row = x + r * Vp;
    if (keep && !keep[r]) {
      loss[r] = 0;
      std::fill_n(row, Vp, 0.0f);
      continue;
    }
    const int64_t t = tg[r];
    const float mx = row_max(row, V);
    const float xt = row[t];
    const double sum = row_sum_exp<true>(row, V, mx);
    loss[r] = static_cast<float>(std::log(sum) + mx - xt);
    const float et = row[t];
    row_scale_round_pad(round_to, row, V, Vp, static_cast<float>(dloss / sum));
    const float gt = static_cast<float>((et / sum - 1.0) * dloss);
    row[t] = half::dispatch(round_to,
                            [&](auto tag) { return half::round1<decltype(tag)::value>(gt); });
  }
}

void crossentropy_forward_backward(Tensor& losses, Tensor& dlogits, Tensor& logits,
                                   const Tensor& targets, int64_t V, float dloss,
                                   const Tensor* mask) {
  KernelScope timed("crossentropy_forward_backward");
  constexpr std::string_view op = "crossentropy_forward_backward";
  const auto dims = check_args(op, losses, logits, targets, V);
  const int64_t R = dims.R, Vp = dims.Vp;
  const uint8_t* keep = check_mask(op, mask, R);
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
#pragma omp parallel for schedule(static) if (R * V > kParallelGrain)
    for (int64_t r = 0; r < R; ++r) {
      if (keep && !keep[r]) {
        loss[r] = 0;
        std::fill_n(dx + r * Vp, Vp, half::Storage<D>{});
        continue;
      }
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
#endif  // HWY_ONCE
