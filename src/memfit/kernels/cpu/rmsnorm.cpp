// RMSNorm forward and backward over rows of C floats (the LLaMA family's norm, see rmsnorm.h).
// One pass for the mean of squares, kept in float vectors and finished in double (no mean to
// subtract, so no second pass); the output pass multiplies by 1/rms, then by the weight, in the
// order LlamaRMSNorm does. Backward splits rows over threads; dweight goes through per-thread
// partials added in thread order. Mixed precision as in layernorm.cpp: the output may be bf16
// or f16, rounded once; the weight may be a bf16 / f16 working copy, widened once per call.
// One source for every SIMD target (simd.h); the public functions are at the end.
#include "memfit/kernels/cpu/rmsnorm.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/rmsnorm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

// 1 / sqrt(mean(x^2) + eps) of one row: squares summed in float vectors, finished in double. A
// 1-lane target would keep a whole row in two float partial sums, so it adds in double instead.
float rms_row_rstd(const float* x, int64_t C, float eps) {
  double sq = 0.0;
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  for (int64_t i = 0; i < C; ++i) sq += static_cast<double>(x[i]) * x[i];
#else
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF a0 = hn::Zero(d), a1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * N <= C; i += 2 * N) {
    const VF x0 = hn::LoadU(d, x + i), x1 = hn::LoadU(d, x + i + N);
    a0 = hn::MulAdd(x0, x0, a0);
    a1 = hn::MulAdd(x1, x1, a1);
  }
  for (; i + N <= C; i += N) {
    const VF x0 = hn::LoadU(d, x + i);
    a0 = hn::MulAdd(x0, x0, a0);
  }
  if (i < C) {  // padding lanes load 0
    const VF x0 = load_n<DType::f32>(d, x + i, C - i);
    a0 = hn::MulAdd(x0, x0, a0);
  }
  sq = sum_lanes_pd(d, hn::Add(a0, a1));
#endif
  const double ms = sq / static_cast<double>(C);
  return static_cast<float>(1.0 / std::sqrt(ms + static_cast<double>(eps)));
}

// out = w * (x * rstd), rounded once to D.
template <DType D>
void rms_row_forward(half::Storage<D>* out, const float* x, const float* w, float rstd,
                     int64_t C) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vr = hn::Set(d, rstd);
  int64_t i = 0;
  for (; i + N <= C; i += N)
    store<D>(d, hn::Mul(hn::LoadU(d, w + i), hn::Mul(hn::LoadU(d, x + i), vr)), out + i);
  if (i < C) {
    const int64_t k = C - i;
    const VF n = hn::Mul(load_n<DType::f32>(d, x + i, k), vr);
    store_n<D>(d, hn::Mul(load_n<DType::f32>(d, w + i, k), n), out + i, k);
  }
}

// Rows [r0, r1) of the forward: out (of dtype od) and rstd.
void RmsNormForwardRows(DType od, void* out, float* pr, const float* x, const float* w,
                        int64_t r0, int64_t r1, int64_t C, float eps) {
  half::dispatch(od, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* o = static_cast<half::Storage<D>*>(out);
    for (int64_t r = r0; r < r1; ++r) {
      const float rstd = rms_row_rstd(x + r * C, C, eps);
      rms_row_forward<D>(o + r * C, x + r * C, w, rstd, C);
      pr[r] = rstd;
    }
  });
}

// Rows [r0, r1) of the output again from the saved rstd (rms_row_forward with the forward's
// own rstd: bit for bit the forward's output).
void RmsNormApplyRows(DType od, void* out, const float* pr, const float* x, const float* w,
                      int64_t r0, int64_t r1, int64_t C) {
  half::dispatch(od, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* o = static_cast<half::Storage<D>*>(out);
    for (int64_t r = r0; r < r1; ++r) rms_row_forward<D>(o + r * C, x + r * C, w, pr[r], C);
  });
}

// One row of the backward (see rmsnorm.h): dw_part is this thread's partial sum of dweight.
void rms_row_backward(float* dx, float* dw_part, const float* dy, const float* x, const float* w,
                      float rstd, int64_t C) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vr = hn::Set(d, rstd);
  // Pass 1: mean(dnorm * norm) and the dweight partials. Padding lanes read dy = 0: they add
  // nothing.
  VF a0 = hn::Zero(d);
  double s = 0.0;
  auto pass1 = [&](int64_t i, int64_t k) {
    const bool full = k == N;
    const VF g = full ? hn::LoadU(d, dy + i) : load_n<DType::f32>(d, dy + i, k);
    const VF xv = full ? hn::LoadU(d, x + i) : load_n<DType::f32>(d, x + i, k);
    const VF wv = full ? hn::LoadU(d, w + i) : load_n<DType::f32>(d, w + i, k);
    const VF n = hn::Mul(xv, vr);
    const VF dn = hn::Mul(wv, g);
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
    // The fallback targets: every lane in double. EMU128 has four (clang's fallback; g++'s is
    // SCALAR, one): reading only the first lane lost three of every four terms.
    s += dot_lanes_pd(d, dn, n);
#else
    a0 = hn::MulAdd(dn, n, a0);
#endif
    if (full)
      hn::StoreU(hn::MulAdd(n, g, hn::LoadU(d, dw_part + i)), d, dw_part + i);
    else
      store_n<DType::f32>(d, hn::MulAdd(n, g, load_n<DType::f32>(d, dw_part + i, k)),
                          dw_part + i, k);
  };
  int64_t i = 0;
  for (; i + N <= C; i += N) pass1(i, N);
  if (i < C) pass1(i, C - i);
  s += sum_lanes_pd(d, a0);
  const VF vdnm = hn::Set(d, static_cast<float>(s / static_cast<double>(C)));
  // Pass 2: dinp += (dnorm - norm * mean(dnorm * norm)) * rstd.
  auto pass2 = [&](int64_t i, int64_t k) {
    const bool full = k == N;
    const VF g = full ? hn::LoadU(d, dy + i) : load_n<DType::f32>(d, dy + i, k);
    const VF xv = full ? hn::LoadU(d, x + i) : load_n<DType::f32>(d, x + i, k);
    const VF wv = full ? hn::LoadU(d, w + i) : load_n<DType::f32>(d, w + i, k);
    const VF t = hn::NegMulAdd(hn::Mul(xv, vr), vdnm, hn::Mul(wv, g));
    if (full)
      hn::StoreU(hn::MulAdd(t, vr, hn::LoadU(d, dx + i)), d, dx + i);
    else
      store_n<DType::f32>(d, hn::MulAdd(t, vr, load_n<DType::f32>(d, dx + i, k)), dx + i, k);
  };
  for (i = 0; i + N <= C; i += N) pass2(i, N);
  if (i < C) pass2(i, C - i);
}

// Rows [r0, r1) of the backward into this thread's dweight partial.
void RmsNormBackwardRows(float* dx, float* dw_part, const float* dy, const float* x,
                         const float* w, const float* pr, int64_t r0, int64_t r1, int64_t C) {
  for (int64_t r = r0; r < r1; ++r)
    rms_row_backward(dx + r * C, dw_part, dy + r * C, x + r * C, w, pr[r], C);
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
HWY_EXPORT(RmsNormForwardRows);
HWY_EXPORT(RmsNormBackwardRows);
HWY_EXPORT(RmsNormApplyRows);

namespace {

// Read into named locals, not a structured binding: clang cannot capture one in an OpenMP
// region.
struct Dims {
  int64_t R, C;
};

// Shapes shared by forward and backward: R rows of C; weight (C) of f32, bf16 or f16; rstd of R
// elements (any shape, so (B, T) works as well as (R)).
Dims check_dims(std::string_view op, const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  const Shape& shape = expect_any_shape(inp, op, "inp");
  MEMFIT_CHECK_SHAPE(shape.rank() >= 1 && shape[-1] > 0, op, "inp {} needs a last dimension > 0",
                     shape);
  const int64_t C = shape[-1], R = shape.numel() / C;
  expect_float_tensor(weight, op, "weight", Shape{C});
  expect_any_shape(rstd, op, "rstd");
  MEMFIT_CHECK_SHAPE(rstd.numel() == R, op,
                     "rstd {} must hold one value per row of inp {} ({} rows)", rstd.shape(),
                     shape, R);
  return {R, C};
}

}  // namespace

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                     float eps) {
  KernelScope timed("rmsnorm_forward");
  constexpr std::string_view op = "rmsnorm_forward";
  const auto dims = check_dims(op, inp, weight, rstd);
  const int64_t R = dims.R, C = dims.C;
  MEMFIT_CHECK(eps >= 0.0f && std::isfinite(eps), op, "eps must be finite and >= 0, got {}", eps);
  expect_float_tensor(out, op, "out", inp.shape());
  float* pr = rstd.data<float>();
  std::vector<float> wbuf;
  const float *x = inp.data<float>(), *w = half::as_f32(weight, wbuf);
  void* o = out.raw_data();
  const DType od = out.dtype();
#pragma omp parallel if (R * C > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    MEMFIT_SIMD_DISPATCH(RmsNormForwardRows)(od, o, pr, x, w, R * tid / nth, R * (tid + 1) / nth,
                                             C, eps);
  }
}

void rmsnorm_apply(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  KernelScope timed("rmsnorm_apply");
  constexpr std::string_view op = "rmsnorm_apply";
  const auto dims = check_dims(op, inp, weight, rstd);
  const int64_t R = dims.R, C = dims.C;
  expect_float_tensor(out, op, "out", inp.shape());
  const float* pr = rstd.data<float>();
  std::vector<float> wbuf;
  const float *x = inp.data<float>(), *w = half::as_f32(weight, wbuf);
  void* o = out.raw_data();
  const DType od = out.dtype();
#pragma omp parallel if (R * C > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    MEMFIT_SIMD_DISPATCH(RmsNormApplyRows)(od, o, pr, x, w, R * tid / nth, R * (tid + 1) / nth,
                                           C);
  }
}

void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd) {
  KernelScope timed("rmsnorm_backward");
  constexpr std::string_view op = "rmsnorm_backward";
  const auto dims = check_dims(op, inp, weight, rstd);
  const int64_t R = dims.R, C = dims.C;
  expect_tensor(dout, op, "dout", inp.shape());
  expect_tensor(dinp, op, "dinp", inp.shape());
  // An undefined dweight (a frozen norm, Note [LoRA]): d(input) alone.
  if (dweight.defined()) expect_tensor(dweight, op, "dweight", Shape{C});
  float *dx = dinp.data<float>(), *dw = dweight.defined() ? dweight.data<float>() : nullptr;
  std::vector<float> wbuf;
  const float *dy = dout.data<float>(), *x = inp.data<float>(), *w = half::as_f32(weight, wbuf);
  const float* pr = rstd.data<float>();

  // Per-thread partials of dweight: C floats a thread, a few KiB, below the pool's notice.
  std::vector<float> partial(static_cast<size_t>(omp_get_max_threads()) * C, 0.0f);
#pragma omp parallel if (R * C > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    MEMFIT_SIMD_DISPATCH(RmsNormBackwardRows)(dx, partial.data() + tid * C, dy, x, w, pr,
                                              R * tid / nth, R * (tid + 1) / nth, C);
    if (dw) {
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t c = 0; c < C; ++c) {
        float sw = 0.0f;
        for (int64_t t = 0; t < nth; ++t) sw += partial[t * C + c];
        dw[c] += sw;
      }
    }
  }
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
