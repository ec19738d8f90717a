// GELU (tanh form) forward and backward over the MLP's (B*T, 4C) activation, the largest
// element-wise op of a GPT-2 step. The formulas and their order of operations follow PyTorch's
// CPU kernel (0.5 x (1 + tanh(inner)), and its derivative written out the same way), so the
// two agree to a few ulp; the tanh is simd-inl.h's vector tanh on every target.
// Every tensor may be f32, bf16 or f16 (mixed precision keeps the MLP's pre-activation in
// bf16): values are widened on load, computed in f32 and rounded once on store.
// One source for every SIMD target (simd.h); the public functions are at the end.
#include "memfit/kernels/cpu/gelu.h"
#include "memfit/kernels/kernel_times.h"

#include <algorithm>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/gelu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kKappa = 0.044715f;

HWY_INLINE VF gelu_vec(DF d, VF x) {
  const VF x_sq = hn::Mul(x, x);
  const VF inner =
      hn::Mul(hn::Set(d, kBeta), hn::MulAdd(hn::Mul(hn::Set(d, kKappa), x_sq), x, x));
  const VF t = tanh(d, inner);
  return hn::Mul(hn::Mul(hn::Set(d, 0.5f), x), hn::Add(hn::Set(d, 1.0f), t));
}

// gelu'(x); and gelu(x) into *y where asked (one tanh for both, with gelu_vec's operations).
HWY_INLINE VF gelu_grad_vec(DF d, VF x, VF* y = nullptr) {
  const VF one = hn::Set(d, 1.0f), half = hn::Set(d, 0.5f);
  const VF x_sq = hn::Mul(x, x);
  const VF inner =
      hn::Mul(hn::Set(d, kBeta), hn::MulAdd(hn::Mul(hn::Set(d, kKappa), x_sq), x, x));
  const VF t = tanh(d, inner);
  const VF left = hn::Mul(half, x);
  if (y) *y = hn::Mul(left, hn::Add(one, t));
  const VF left_derivative = hn::Mul(half, hn::Add(one, t));
  const VF inner_derivative =
      hn::Mul(hn::Set(d, kBeta), hn::MulAdd(hn::Set(d, 3.0f * kKappa), x_sq, one));
  const VF tanh_derivative = hn::NegMulAdd(t, t, one);
  return hn::MulAdd(hn::Mul(left, tanh_derivative), inner_derivative, left_derivative);
}

// out = gelu(x) over [begin, end): loads widen and stores round as the storage types say;
// the f32 instance is the FP32 kernel.
template <DType X, DType O>
void forward_range(half::Storage<O>* o, const half::Storage<X>* x, int64_t begin, int64_t end) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = begin;
  for (; i + N <= end; i += N) store<O>(d, gelu_vec(d, load<X>(d, x + i)), o + i);
  if (i < end) store_n<O>(d, gelu_vec(d, load_n<X>(d, x + i, end - i)), o + i, end - i);
}

template <DType X, DType G, DType D>
void backward_range(half::Storage<D>* dx, const half::Storage<X>* x, const half::Storage<G>* dy,
                    int64_t begin, int64_t end) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = begin;
  for (; i + N <= end; i += N)
    store<D>(d, hn::Mul(gelu_grad_vec(d, load<X>(d, x + i)), load<G>(d, dy + i)), dx + i);
  if (i < end) {
    const int64_t n = end - i;
    const VF g = gelu_grad_vec(d, load_n<X>(d, x + i, n));
    store_n<D>(d, hn::Mul(g, load_n<G>(d, dy + i, n)), dx + i, n);
  }
}

// out = gelu(x) and dx (in place over dy) = gelu'(x) dy over [begin, end), one tanh per
// element for both: the same bits as forward_range then backward_range.
template <DType X, DType O, DType D>
void recompute_backward_range(half::Storage<O>* o, half::Storage<D>* dxy,
                              const half::Storage<X>* x, int64_t begin, int64_t end) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = begin; i < end; i += N) {
    const int64_t n = std::min(N, end - i);
    VF y;
    if (n == N) {
      const VF g = gelu_grad_vec(d, load<X>(d, x + i), &y);
      store<O>(d, y, o + i);
      store<D>(d, hn::Mul(g, load<D>(d, dxy + i)), dxy + i);
    } else {
      const VF g = gelu_grad_vec(d, load_n<X>(d, x + i, n), &y);
      store_n<O>(d, y, o + i, n);
      store_n<D>(d, hn::Mul(g, load_n<D>(d, dxy + i, n)), dxy + i, n);
    }
  }
}

void GeluRecomputeBackwardRange(DType xt, DType ot, DType dt, void* out, void* dxy,
                                const void* inp, int64_t begin, int64_t end) {
  half::dispatch(xt, [&](auto xtag) {
    half::dispatch(ot, [&](auto otag) {
      half::dispatch(dt, [&](auto dtag) {
        constexpr DType X = decltype(xtag)::value, O = decltype(otag)::value,
                        D = decltype(dtag)::value;
        recompute_backward_range<X, O, D>(static_cast<half::Storage<O>*>(out),
                                          static_cast<half::Storage<D>*>(dxy),
                                          static_cast<const half::Storage<X>*>(inp), begin, end);
      });
    });
  });
}

void GeluForwardRange(DType xt, DType ot, void* out, const void* inp, int64_t begin, int64_t end) {
  half::dispatch(xt, [&](auto xtag) {
    half::dispatch(ot, [&](auto otag) {
      constexpr DType X = decltype(xtag)::value, O = decltype(otag)::value;
      forward_range<X, O>(static_cast<half::Storage<O>*>(out),
                          static_cast<const half::Storage<X>*>(inp), begin, end);
    });
  });
}

void GeluBackwardRange(DType xt, DType gt, DType dt, void* dinp, const void* inp, const void* dout,
                   int64_t begin, int64_t end) {
  half::dispatch(xt, [&](auto xtag) {
    half::dispatch(gt, [&](auto gtag) {
      half::dispatch(dt, [&](auto dtag) {
        constexpr DType X = decltype(xtag)::value, G = decltype(gtag)::value,
                        D = decltype(dtag)::value;
        backward_range<X, G, D>(static_cast<half::Storage<D>*>(dinp),
                                static_cast<const half::Storage<X>*>(inp),
                                static_cast<const half::Storage<G>*>(dout), begin, end);
      });
    });
  });
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(GeluForwardRange);
HWY_EXPORT(GeluBackwardRange);
HWY_EXPORT(GeluRecomputeBackwardRange);

void gelu_forward(Tensor& out, const Tensor& inp) {
  KernelScope timed("gelu_forward");
  constexpr std::string_view op = "gelu_forward";
  expect_float_any_shape(inp, op, "inp");
  expect_float_tensor(out, op, "out", inp.shape());
  const DType xt = inp.dtype(), ot = out.dtype();
  void* o = out.raw_data();
  const void* x = inp.raw_data();
  parallel_ranges(inp.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(GeluForwardRange)(xt, ot, o, x, begin, end);
  });
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  KernelScope timed("gelu_backward");
  constexpr std::string_view op = "gelu_backward";
  expect_float_any_shape(inp, op, "inp");
  expect_float_tensor(dout, op, "dout", inp.shape());
  expect_float_tensor(dinp, op, "dinp", inp.shape());
  // In place needs equal element sizes: a narrower dinp over a wider dout would overwrite
  // elements that another thread has yet to read.
  MEMFIT_CHECK_DTYPE(dinp.raw_data() != dout.raw_data() || dinp.dtype() == dout.dtype(), op,
                     "dinp ({}) may alias dout ({}) only when their dtypes match",
                     dtype_name(dinp.dtype()), dtype_name(dout.dtype()));
  const DType xt = inp.dtype(), gt = dout.dtype(), dt = dinp.dtype();
  void* dx = dinp.raw_data();
  const void *x = inp.raw_data(), *dy = dout.raw_data();
  // dinp may alias dout: each element is read before it is written, by the same thread.
  parallel_ranges(inp.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(GeluBackwardRange)(xt, gt, dt, dx, x, dy, begin, end);
  });
}

void gelu_recompute_backward(Tensor& out, Tensor& dinout, const Tensor& inp) {
  KernelScope timed("gelu_recompute_backward");
  constexpr std::string_view op = "gelu_recompute_backward";
  expect_float_any_shape(inp, op, "inp");
  expect_float_tensor(out, op, "out", inp.shape());
  expect_float_tensor(dinout, op, "dinout", inp.shape());
  const DType xt = inp.dtype(), ot = out.dtype(), dt = dinout.dtype();
  void *o = out.raw_data(), *dxy = dinout.raw_data();
  const void* x = inp.raw_data();
  parallel_ranges(inp.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(GeluRecomputeBackwardRange)(xt, ot, dt, o, dxy, x, begin, end);
  });
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
