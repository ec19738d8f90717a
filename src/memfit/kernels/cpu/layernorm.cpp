// LayerNorm forward and backward over rows of C floats. A row (3 KiB at C = 768) stays in L1,
// so the extra passes of two-pass statistics cost little and buy accuracy: the mean, then the
// centred sum of squares, each kept in float vectors and finished in double. Backward splits
// rows over threads; dweight and dbias go through per-thread partials that are added in
// thread order, so results do not depend on scheduling.
// Mixed precision: the output may be bf16 or f16 (rounded once, from the f32 result), and the
// weight and bias may be a bf16 / f16 working copy, widened once per call; the input, the
// statistics and the whole backward stay f32 (see docs/notes/mixed-precision.md).
// One source for every SIMD target (simd.h); the public functions are at the end.
#include "memfit/kernels/cpu/layernorm.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/layernorm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "memfit/kernels/cpu/simd-inl.h"

#ifndef MEMFIT_KERNELS_CPU_LAYERNORM_ROWSTATS_
#define MEMFIT_KERNELS_CPU_LAYERNORM_ROWSTATS_
namespace memfit::kernels::layernorm_detail {
struct RowStats {
  float mean;
  float rstd;
};
}  // namespace memfit::kernels::layernorm_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
using layernorm_detail::RowStats;

// Two-pass statistics of one row: float vectors, finished in double. A 1-lane target would
// keep a whole row in two float partial sums, so it adds in double throughout instead.
RowStats row_stats(const float* x, int64_t C) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  double sum = 0.0, sq = 0.0;
  for (int64_t i = 0; i < C; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / static_cast<double>(C));
  for (int64_t i = 0; i < C; ++i) {
    const double dv = static_cast<double>(x[i]) - mean;
    sq += dv * dv;
  }
  const double var = sq / static_cast<double>(C);
  return {mean, static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(kLayerNormEps)))};
#else
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * N <= C; i += 2 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, x + i));
    a1 = hn::Add(a1, hn::LoadU(d, x + i + N));
  }
  for (; i + N <= C; i += N) a0 = hn::Add(a0, hn::LoadU(d, x + i));
  if (i < C) a0 = hn::Add(a0, load_n<DType::f32>(d, x + i, C - i));
  const double sum = sum_lanes_pd(d, hn::Add(a0, a1));
  const float mean = static_cast<float>(sum / static_cast<double>(C));
  const VF vm = hn::Set(d, mean);
  a0 = a1 = hn::Zero(d);
  for (i = 0; i + 2 * N <= C; i += 2 * N) {
    const VF d0 = hn::Sub(hn::LoadU(d, x + i), vm);
    const VF d1 = hn::Sub(hn::LoadU(d, x + i + N), vm);
    a0 = hn::MulAdd(d0, d0, a0);
    a1 = hn::MulAdd(d1, d1, a1);
  }
  for (; i + N <= C; i += N) {
    const VF d0 = hn::Sub(hn::LoadU(d, x + i), vm);
    a0 = hn::MulAdd(d0, d0, a0);
  }
  if (i < C) {
    const VF d0 = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(C - i)),
                                     hn::Sub(load_n<DType::f32>(d, x + i, C - i), vm));
    a0 = hn::MulAdd(d0, d0, a0);
  }
  const double var = sum_lanes_pd(d, hn::Add(a0, a1)) / static_cast<double>(C);
  return {mean, static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(kLayerNormEps)))};
#endif
}

template <DType D>
void row_forward(half::Storage<D>* out, const float* x, const float* w, const float* b, RowStats s,
                 int64_t C) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vm = hn::Set(d, s.mean), vr = hn::Set(d, s.rstd);
  int64_t i = 0;
  for (; i + N <= C; i += N) {
    const VF n = hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vr);
    store<D>(d, hn::MulAdd(n, hn::LoadU(d, w + i), hn::LoadU(d, b + i)), out + i);
  }
  if (i < C) {
    const int64_t k = C - i;
    const VF n = hn::Mul(hn::Sub(load_n<DType::f32>(d, x + i, k), vm), vr);
    store_n<D>(d, hn::MulAdd(n, load_n<DType::f32>(d, w + i, k), load_n<DType::f32>(d, b + i, k)),
               out + i, k);
  }
}

// Rows [r0, r1) of the forward: out (of dtype od), mean and rstd.
void LayerNormForwardRows(DType od, void* out, float* pm, float* pr, const float* x, const float* w,
                 const float* b, int64_t r0, int64_t r1, int64_t C) {
  half::dispatch(od, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* o = static_cast<half::Storage<D>*>(out);
    for (int64_t r = r0; r < r1; ++r) {
      const RowStats s = row_stats(x + r * C, C);
      row_forward<D>(o + r * C, x + r * C, w, b, s, C);
      pm[r] = s.mean;
      pr[r] = s.rstd;
    }
  });
}

// Rows [r0, r1) of the output again from the saved statistics: row_forward with the very
// statistics the forward computed, so each element is the forward's, bit for bit.
void LayerNormApplyRows(DType od, void* out, const float* pm, const float* pr, const float* x,
                        const float* w, const float* b, int64_t r0, int64_t r1, int64_t C) {
  half::dispatch(od, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* o = static_cast<half::Storage<D>*>(out);
    for (int64_t r = r0; r < r1; ++r) row_forward<D>(o + r * C, x + r * C, w, b, {pm[r], pr[r]}, C);
  });
}

// One row of the backward (see layernorm.h for the conventions): dw_part and db_part are this
// thread's partial sums of dweight and dbias.
void row_backward(float* dx, float* dw_part, float* db_part, const float* dy, const float* x,
                  const float* w, RowStats s, int64_t C) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vm = hn::Set(d, s.mean), vr = hn::Set(d, s.rstd);
  // Pass 1: the two row means the input gradient needs, and the parameter partials. The tail's
  // padding lanes read g = 0, so they add nothing.
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
  double s0 = 0.0, s1 = 0.0;
  auto pass1 = [&](int64_t i, int64_t k) {
    const bool full = k == N;
    const VF g = full ? hn::LoadU(d, dy + i) : load_n<DType::f32>(d, dy + i, k);
    const VF xv = full ? hn::LoadU(d, x + i) : load_n<DType::f32>(d, x + i, k);
    const VF wv = full ? hn::LoadU(d, w + i) : load_n<DType::f32>(d, w + i, k);
    const VF n = hn::Mul(hn::Sub(xv, vm), vr);
    const VF dn = hn::Mul(wv, g);
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
    // The fallback targets: the row means in double, as row_stats does, over every lane. EMU128
    // has four (clang's fallback; g++'s is SCALAR, one): reading only the first lost the rest.
    s0 += sum_lanes_pd(d, dn);
    s1 += dot_lanes_pd(d, dn, n);
#else
    a0 = hn::Add(a0, dn);
    a1 = hn::MulAdd(dn, n, a1);
#endif
    if (full) {
      hn::StoreU(hn::Add(hn::LoadU(d, db_part + i), g), d, db_part + i);
      hn::StoreU(hn::MulAdd(n, g, hn::LoadU(d, dw_part + i)), d, dw_part + i);
    } else {
      store_n<DType::f32>(d, hn::Add(load_n<DType::f32>(d, db_part + i, k), g), db_part + i, k);
      store_n<DType::f32>(d, hn::MulAdd(n, g, load_n<DType::f32>(d, dw_part + i, k)),
                          dw_part + i, k);
    }
  };
  int64_t i = 0;
  for (; i + N <= C; i += N) pass1(i, N);
  if (i < C) pass1(i, C - i);
  s0 += sum_lanes_pd(d, a0);
  s1 += sum_lanes_pd(d, a1);
  const float dnorm_mean = static_cast<float>(s0 / static_cast<double>(C));
  const float dnorm_norm_mean = static_cast<float>(s1 / static_cast<double>(C));
  // Pass 2: dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd.
  const VF vdm = hn::Set(d, dnorm_mean), vdnm = hn::Set(d, dnorm_norm_mean);
  auto pass2 = [&](int64_t i, int64_t k) {
    const bool full = k == N;
    const VF g = full ? hn::LoadU(d, dy + i) : load_n<DType::f32>(d, dy + i, k);
    const VF xv = full ? hn::LoadU(d, x + i) : load_n<DType::f32>(d, x + i, k);
    const VF wv = full ? hn::LoadU(d, w + i) : load_n<DType::f32>(d, w + i, k);
    const VF n = hn::Mul(hn::Sub(xv, vm), vr);
    const VF t = hn::NegMulAdd(n, vdnm, hn::Sub(hn::Mul(wv, g), vdm));
    if (full)
      hn::StoreU(hn::MulAdd(t, vr, hn::LoadU(d, dx + i)), d, dx + i);
    else
      store_n<DType::f32>(d, hn::MulAdd(t, vr, load_n<DType::f32>(d, dx + i, k)), dx + i, k);
  };
  for (i = 0; i + N <= C; i += N) pass2(i, N);
  if (i < C) pass2(i, C - i);
}

// Rows [r0, r1) of the backward into this thread's partials.
void LayerNormBackwardRows(float* dx, float* dw_part, float* db_part, const float* dy, const float* x,
                  const float* w, const float* pm, const float* pr, int64_t r0, int64_t r1,
                  int64_t C) {
  for (int64_t r = r0; r < r1; ++r)
    row_backward(dx + r * C, dw_part, db_part, dy + r * C, x + r * C, w, {pm[r], pr[r]}, C);
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <vector>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(LayerNormForwardRows);
HWY_EXPORT(LayerNormBackwardRows);
HWY_EXPORT(LayerNormApplyRows);

namespace {

// Shapes shared by forward and backward: R rows of C, mean and rstd of R elements (any shape,
// so (B, T) works as well as (R)).
// Read into named locals, not a structured binding: clang cannot capture one in an OpenMP
// region.
struct Dims {
  int64_t R, C;
};

Dims check_dims(std::string_view op, const Tensor& inp, const Tensor& weight, const Tensor& mean,
                const Tensor& rstd) {
  const Shape& shape = expect_any_shape(inp, op, "inp");
  MEMFIT_CHECK_SHAPE(shape.rank() >= 1 && shape[-1] > 0, op, "inp {} needs a last dimension > 0",
                     shape);
  const int64_t C = shape[-1], R = shape.numel() / C;
  expect_float_tensor(weight, op, "weight", Shape{C});
  expect_any_shape(mean, op, "mean");
  expect_any_shape(rstd, op, "rstd");
  MEMFIT_CHECK_SHAPE(mean.numel() == R && rstd.numel() == R, op,
                     "mean {} and rstd {} must hold one value per row of inp {} ({} rows)",
                     mean.shape(), rstd.shape(), shape, R);
  return {R, C};
}

}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias) {
  KernelScope timed("layernorm_forward");
  constexpr std::string_view op = "layernorm_forward";
  const auto dims = check_dims(op, inp, weight, mean, rstd);
  const int64_t R = dims.R, C = dims.C;
  expect_float_tensor(bias, op, "bias", Shape{C});
  expect_float_tensor(out, op, "out", inp.shape());
  float *pm = mean.data<float>(), *pr = rstd.data<float>();
  std::vector<float> wbuf, bbuf;
  const float *x = inp.data<float>(), *w = half::as_f32(weight, wbuf), *b = half::as_f32(bias, bbuf);
  void* o = out.raw_data();
  const DType od = out.dtype();
#pragma omp parallel if (R * C > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    MEMFIT_SIMD_DISPATCH(LayerNormForwardRows)(od, o, pm, pr, x, w, b, R * tid / nth, R * (tid + 1) / nth, C);
  }
}

void layernorm_apply(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                     const Tensor& mean, const Tensor& rstd) {
  KernelScope timed("layernorm_apply");
  constexpr std::string_view op = "layernorm_apply";
  const auto dims = check_dims(op, inp, weight, mean, rstd);
  const int64_t R = dims.R, C = dims.C;
  expect_float_tensor(bias, op, "bias", Shape{C});
  expect_float_tensor(out, op, "out", inp.shape());
  const float *pm = mean.data<float>(), *pr = rstd.data<float>();
  std::vector<float> wbuf, bbuf;
  const float *x = inp.data<float>(), *w = half::as_f32(weight, wbuf), *b = half::as_f32(bias, bbuf);
  void* o = out.raw_data();
  const DType od = out.dtype();
#pragma omp parallel if (R * C > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    MEMFIT_SIMD_DISPATCH(LayerNormApplyRows)(od, o, pm, pr, x, w, b, R * tid / nth,
                                             R * (tid + 1) / nth, C);
  }
}

void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  KernelScope timed("layernorm_backward");
  constexpr std::string_view op = "layernorm_backward";
  const auto dims = check_dims(op, inp, weight, mean, rstd);
  const int64_t R = dims.R, C = dims.C;
  expect_tensor(dout, op, "dout", inp.shape());
  expect_tensor(dinp, op, "dinp", inp.shape());
  // Undefined dweight and dbias (a frozen norm, Note [LoRA]): d(input) alone.
  const bool params = dweight.defined() || dbias.defined();
  if (params) {
    expect_tensor(dweight, op, "dweight", Shape{C});
    expect_tensor(dbias, op, "dbias", Shape{C});
  }
  float *dx = dinp.data<float>(), *dw = params ? dweight.data<float>() : nullptr,
        *db = params ? dbias.data<float>() : nullptr;
  std::vector<float> wbuf;
  const float *dy = dout.data<float>(), *x = inp.data<float>(), *w = half::as_f32(weight, wbuf);
  const float *pm = mean.data<float>(), *pr = rstd.data<float>();

  // Per-thread partials of dweight and dbias: 2 C floats a thread, a few KiB, below the
  // pool's notice.
  std::vector<float> partial(static_cast<size_t>(omp_get_max_threads()) * 2 * C, 0.0f);
#pragma omp parallel if (R * C > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    float* dw_part = partial.data() + tid * 2 * C;
    float* db_part = dw_part + C;
    MEMFIT_SIMD_DISPATCH(LayerNormBackwardRows)(dx, dw_part, db_part, dy, x, w, pm, pr, R * tid / nth,
                                       R * (tid + 1) / nth, C);
    if (params) {
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t c = 0; c < C; ++c) {
        float sw = 0.0f, sb = 0.0f;
        for (int64_t t = 0; t < nth; ++t) {
          sw += partial[t * 2 * C + c];
          sb += partial[t * 2 * C + C + c];
        }
        dw[c] += sw;
        db[c] += sb;
      }
    }
  }
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
