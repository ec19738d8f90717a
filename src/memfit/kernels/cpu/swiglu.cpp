// SwiGLU forward and backward (see swiglu.h) over the fused gate/up projection output, the
// LLaMA MLP's widest activation: (B*T, 2F) with F = 8/3 C rounded (11008 for Llama 2 7B).
// Element-wise, so the work is split as a flat range over the (N, F) output and each thread
// walks its range row segment by row segment: g and u of output element (n, f) sit at
// n*2F + f and n*2F + F + f. The sigmoid uses simd-inl.h's vector exp on every target; every
// tensor may be f32, bf16 or f16, widened on load and rounded once on store (as gelu.cpp).
// One source for every SIMD target (simd.h); the public functions are at the end.
#include "memfit/kernels/cpu/swiglu.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/swiglu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

// e = exp(-g) with -g capped at 88 (e^88 is a finite float, so 1 + e and e / (1 + e) stay
// finite), and the denominator 1 + e of sigmoid(g) = 1 / (1 + e) and silu(g) = g / (1 + e).
struct SigmoidParts {
  VF e, den;
};

HWY_INLINE SigmoidParts sigmoid_parts(DF d, VF g) {
  const VF e = exp(d, hn::Min(hn::Neg(g), hn::Set(d, 88.0f)));
  return {e, hn::Add(hn::Set(d, 1.0f), e)};
}

// Calls fn(off, f0, k) for each row segment of the flat output range [begin, end): output
// elements [off, off + k), at column f0 of their row, whose g starts at gate_up offset
// row * 2F + f0 (off = row * F + f0).
template <typename Fn>
HWY_INLINE void for_segments(int64_t begin, int64_t end, int64_t F, Fn&& fn) {
  for (int64_t off = begin; off < end;) {
    const int64_t row = off / F, f0 = off - row * F;
    const int64_t k = std::min(end, (row + 1) * F) - off;
    fn(off, row * 2 * F + f0, k);
    off += k;
  }
}

template <DType X, DType O>
void forward_range(half::Storage<O>* o, const half::Storage<X>* gu, int64_t begin, int64_t end,
                   int64_t F) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for_segments(begin, end, F, [&](int64_t off, int64_t gi, int64_t k) {
    const half::Storage<X>* g = gu + gi;
    const half::Storage<X>* u = g + F;
    half::Storage<O>* out = o + off;
    auto one = [&](int64_t i, int64_t n) {
      const bool full = n == N;
      const VF gv = full ? load<X>(d, g + i) : load_n<X>(d, g + i, n);
      const VF uv = full ? load<X>(d, u + i) : load_n<X>(d, u + i, n);
      const VF y = hn::Mul(hn::Div(gv, sigmoid_parts(d, gv).den), uv);
      if (full) store<O>(d, y, out + i);
      else store_n<O>(d, y, out + i, n);
    };
    int64_t i = 0;
    for (; i + N <= k; i += N) one(i, N);
    if (i < k) one(i, k - i);
  });
}

template <DType X, DType G, DType D>
void backward_range(half::Storage<D>* dgu, const half::Storage<G>* dy,
                    const half::Storage<X>* gu, int64_t begin, int64_t end, int64_t F) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF one_v = hn::Set(d, 1.0f);
  for_segments(begin, end, F, [&](int64_t off, int64_t gi, int64_t k) {
    const half::Storage<X>* g = gu + gi;
    const half::Storage<X>* u = g + F;
    const half::Storage<G>* dyr = dy + off;
    half::Storage<D>* dg = dgu + gi;
    half::Storage<D>* du = dg + F;
    auto one = [&](int64_t i, int64_t n) {
      const bool full = n == N;
      // Both halves are read before either is written: dgate_up may alias gate_up.
      const VF gv = full ? load<X>(d, g + i) : load_n<X>(d, g + i, n);
      const VF uv = full ? load<X>(d, u + i) : load_n<X>(d, u + i, n);
      const VF yv = full ? load<G>(d, dyr + i) : load_n<G>(d, dyr + i, n);
      const SigmoidParts p = sigmoid_parts(d, gv);
      const VF s = hn::Div(one_v, p.den);
      const VF silu = hn::Div(gv, p.den);
      // silu'(g) = s (1 + g (1 - s)), 1 - s = e s.
      const VF dsilu = hn::Mul(s, hn::MulAdd(gv, hn::Mul(p.e, s), one_v));
      const VF dgv = hn::Mul(hn::Mul(yv, uv), dsilu);
      const VF duv = hn::Mul(yv, silu);
      if (full) {
        store<D>(d, dgv, dg + i);
        store<D>(d, duv, du + i);
      } else {
        store_n<D>(d, dgv, dg + i, n);
        store_n<D>(d, duv, du + i, n);
      }
    };
    int64_t i = 0;
    for (; i + N <= k; i += N) one(i, N);
    if (i < k) one(i, k - i);
  });
}

void SwigluForwardRange(DType xt, DType ot, void* out, const void* gate_up, int64_t begin,
                        int64_t end, int64_t F) {
  half::dispatch(xt, [&](auto xtag) {
    half::dispatch(ot, [&](auto otag) {
      constexpr DType X = decltype(xtag)::value, O = decltype(otag)::value;
      forward_range<X, O>(static_cast<half::Storage<O>*>(out),
                          static_cast<const half::Storage<X>*>(gate_up), begin, end, F);
    });
  });
}

void SwigluBackwardRange(DType xt, DType gt, DType dt, void* dgate_up, const void* dout,
                         const void* gate_up, int64_t begin, int64_t end, int64_t F) {
  half::dispatch(xt, [&](auto xtag) {
    half::dispatch(gt, [&](auto gtag) {
      half::dispatch(dt, [&](auto dtag) {
        constexpr DType X = decltype(xtag)::value, G = decltype(gtag)::value,
                        D = decltype(dtag)::value;
        backward_range<X, G, D>(static_cast<half::Storage<D>*>(dgate_up),
                                static_cast<const half::Storage<G>*>(dout),
                                static_cast<const half::Storage<X>*>(gate_up), begin, end, F);
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
HWY_EXPORT(SwigluForwardRange);
HWY_EXPORT(SwigluBackwardRange);

namespace {

// gate_up (N..., 2F) with 2F > 0 and even; returns F. `half` (out or dout) must be (N..., F).
int64_t check_halves(std::string_view op, const Tensor& gate_up, const Tensor& half_t,
                     std::string_view half_name) {
  const Shape& s = expect_float_any_shape(gate_up, op, "gate_up");
  MEMFIT_CHECK_SHAPE(s.rank() >= 1 && s[-1] > 0 && s[-1] % 2 == 0, op,
                     "gate_up {} needs an even last dimension > 0 ([gate | up])", s);
  Shape want = s;
  want[-1] = s[-1] / 2;
  const Shape& h = expect_float_any_shape(half_t, op, half_name);
  MEMFIT_CHECK_SHAPE(h == want, op, "{} must be {} for gate_up {}, got {}", half_name, want, s, h);
  return want[-1];
}

}  // namespace

void swiglu_forward(Tensor& out, const Tensor& gate_up) {
  KernelScope timed("swiglu_forward");
  constexpr std::string_view op = "swiglu_forward";
  const int64_t F = check_halves(op, gate_up, out, "out");
  const DType xt = gate_up.dtype(), ot = out.dtype();
  void* o = out.raw_data();
  const void* gu = gate_up.raw_data();
  parallel_ranges(out.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(SwigluForwardRange)(xt, ot, o, gu, begin, end, F);
  });
}

void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  KernelScope timed("swiglu_backward");
  constexpr std::string_view op = "swiglu_backward";
  const int64_t F = check_halves(op, gate_up, dout, "dout");
  expect_float_any_shape(dgate_up, op, "dgate_up");
  MEMFIT_CHECK_SHAPE(dgate_up.shape() == gate_up.shape(), op, "dgate_up must be {}, got {}",
                     gate_up.shape(), dgate_up.shape());
  // In place needs equal element sizes: a narrower dgate_up over a wider gate_up would
  // overwrite elements that another thread has yet to read.
  MEMFIT_CHECK_DTYPE(dgate_up.raw_data() != gate_up.raw_data() ||
                         dgate_up.dtype() == gate_up.dtype(),
                     op, "dgate_up ({}) may alias gate_up ({}) only when their dtypes match",
                     dtype_name(dgate_up.dtype()), dtype_name(gate_up.dtype()));
  const DType xt = gate_up.dtype(), gt = dout.dtype(), dt = dgate_up.dtype();
  void* dgu = dgate_up.raw_data();
  const void *dy = dout.raw_data(), *gu = gate_up.raw_data();
  parallel_ranges(dout.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(SwigluBackwardRange)(xt, gt, dt, dgu, dy, gu, begin, end, F);
  });
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
