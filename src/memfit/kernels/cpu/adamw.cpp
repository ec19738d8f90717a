// AdamW's element-wise update, written to follow torch.optim.AdamW (single-tensor path)
// operation by operation so that memfit and PyTorch parameters agree to an ulp or two after a
// step, not just to the formula:
//   p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);  v = v b2 + ((1 - b2) g) g;
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) m / denom.
// The scalars are formed in double, as Python does, then rounded to float. The update streams
// four arrays in and three out, so it is memory-bound; divisions stay divisions (as in torch)
// because they are free next to the memory traffic. The mixed-precision variants share the
// arithmetic and differ only in how the weight is loaded and stored (a policy type below).
// One source for every SIMD target (simd.h); the public functions are at the end.
#include "memfit/kernels/cpu/adamw.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/adamw.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/simd-inl.h"

#ifndef MEMFIT_KERNELS_CPU_ADAMW_COEFFS_
#define MEMFIT_KERNELS_CPU_ADAMW_COEFFS_
namespace memfit::kernels::adamw_detail {
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

// Where the weights live: f32; an f32 master and its bf16 / f16 working copy written in the
// same pass; or bf16 stored with stochastic rounding (element i draws from (seed, index0 + i)).
enum class Mode { f32, master, stochastic };
struct Weights {
  Mode mode;
  DType working;  // master: bf16 or f16
  float* p;       // f32, master
  void* w;        // master: the working copy; stochastic: the bf16 weights
  uint64_t seed, index0;
};
}  // namespace memfit::kernels::adamw_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace {
using adamw_detail::Coeffs;
using adamw_detail::Mode;
using adamw_detail::Weights;

// The weight as a policy of update_range: load the old weight of lanes [i, i + n) (n <= Lanes,
// other lanes 0), store the new one. The arithmetic in between is shared by every mode.
template <Mode kMode, DType kWorking>
struct Policy {
  const Weights& w;
  VF load(DF d, int64_t i, int64_t n) const {
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    if constexpr (kMode == Mode::stochastic) {
      const auto* p = static_cast<const uint16_t*>(w.w) + i;
      return n == N ? HWY_NAMESPACE::load<DType::bf16>(d, p) : load_n<DType::bf16>(d, p, n);
    } else {
      return n == N ? hn::LoadU(d, w.p + i) : load_n<DType::f32>(d, w.p + i, n);
    }
  }
  void store1(int64_t i, float x) const {
    const uint64_t idx = w.index0 + static_cast<uint64_t>(i);
    static_cast<uint16_t*>(w.w)[i] = bf16_from_f32_stochastic(
        x, sr_bits(sr_key(w.seed, static_cast<uint32_t>(idx >> 32)), static_cast<uint32_t>(idx)));
  }
  void store(DF d, int64_t i, int64_t n, VF x) const {
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    if constexpr (kMode == Mode::stochastic) {
      const uint64_t first = w.index0 + static_cast<uint64_t>(i);
      if (n < N || (first >> 32) != ((first + N - 1) >> 32)) {  // tail, or lanes across 2^32
        HWY_ALIGN float lanes[kMaxLanes];
        hn::Store(x, d, lanes);
        for (int64_t j = 0; j < n; ++j) store1(i + j, lanes[j]);
        return;
      }
      const hn::RebindToUnsigned<DF> du;
      const auto key = hn::Set(du, sr_key(w.seed, static_cast<uint32_t>(first >> 32)));
      // Iota(du, 0) is a constant the compiler hoists out of the caller's loop.
      auto r = hn::Xor(hn::Add(hn::Iota(du, 0), hn::Set(du, static_cast<uint32_t>(first))), key);
      r = hn::Xor(r, hn::ShiftRight<16>(r));
      r = hn::Mul(r, hn::Set(du, 0x7feb352du));
      r = hn::Xor(r, hn::ShiftRight<15>(r));
      r = hn::Mul(r, hn::Set(du, 0x846ca68bu));
      r = hn::Xor(r, hn::ShiftRight<16>(r));
      store_u16(d, bf16_stochastic_bits(d, x, r), static_cast<uint16_t*>(w.w) + i);
    } else {
      if (n == N) hn::StoreU(x, d, w.p + i);
      else store_n<DType::f32>(d, x, w.p + i, n);
      if constexpr (kMode == Mode::master) {
        auto* h = static_cast<half::Storage<kWorking>*>(w.w) + i;
        if (n == N) HWY_NAMESPACE::store<kWorking>(d, x, h);
        else store_n<kWorking>(d, x, h, n);
      }
    }
  }
};

// S: the moments' storage, f32 or bf16 (--optim-state-dtype bf16: widened on load, the
// arithmetic in f32 as for f32 moments, the new moments rounded to nearest even on store; the
// weight moves with the unrounded ones).
template <DType S, typename P>
void update_range(const P& w, const float* g, half::Storage<S>* m, half::Storage<S>* v,
                  const Coeffs& k, int64_t begin, int64_t end) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF gs = hn::Set(d, k.grad_scale), decay = hn::Set(d, k.decay);
  const VF w1 = hn::Set(d, k.w1), b2 = hn::Set(d, k.b2), c2 = hn::Set(d, k.c2);
  const VF bc2s = hn::Set(d, k.bc2_sqrt), eps = hn::Set(d, k.eps);
  const VF ns = hn::Set(d, k.neg_step);
  for (int64_t i = begin; i < end; i += N) {
    const int64_t n = end - i < N ? end - i : N;
    const bool full = n == N;
    const VF gv = hn::Mul(full ? hn::LoadU(d, g + i) : load_n<DType::f32>(d, g + i, n), gs);
    const VF pv = hn::Mul(w.load(d, i, n), decay);
    VF mv = full ? HWY_NAMESPACE::load<S>(d, m + i) : load_n<S>(d, m + i, n);
    mv = hn::MulAdd(w1, hn::Sub(gv, mv), mv);
    VF vv = hn::Mul(full ? HWY_NAMESPACE::load<S>(d, v + i) : load_n<S>(d, v + i, n), b2);
    vv = hn::Add(vv, hn::Mul(hn::Mul(c2, gv), gv));
    const VF denom = hn::Add(hn::Div(hn::Sqrt(vv), bc2s), eps);
    const VF pn = hn::Add(pv, hn::Div(hn::Mul(ns, mv), denom));
    if (full) {
      HWY_NAMESPACE::store<S>(d, mv, m + i);
      HWY_NAMESPACE::store<S>(d, vv, v + i);
    } else {
      store_n<S>(d, mv, m + i, n);
      store_n<S>(d, vv, v + i, n);
    }
    w.store(d, i, n, pn);
  }
}

}  // namespace

namespace {
template <DType S>
void update_moments(const Weights& w, const float* g, void* m, void* v, const Coeffs& k,
                    int64_t begin, int64_t end) {
  auto* ms = static_cast<half::Storage<S>*>(m);
  auto* vs = static_cast<half::Storage<S>*>(v);
  switch (w.mode) {
    case Mode::f32:
      return update_range<S>(Policy<Mode::f32, DType::f32>{w}, g, ms, vs, k, begin, end);
    case Mode::stochastic:
      return update_range<S>(Policy<Mode::stochastic, DType::bf16>{w}, g, ms, vs, k, begin, end);
    case Mode::master:
      if (w.working == DType::bf16)
        return update_range<S>(Policy<Mode::master, DType::bf16>{w}, g, ms, vs, k, begin, end);
      return update_range<S>(Policy<Mode::master, DType::f16>{w}, g, ms, vs, k, begin, end);
  }
}
}  // namespace

// m and v: f32, or bf16 when state is bf16.
void AdamwUpdateRange(const Weights& w, const float* g, void* m, void* v, DType state,
                      const Coeffs& k, int64_t begin, int64_t end) {
  if (state == DType::bf16) return update_moments<DType::bf16>(w, g, m, v, k, begin, end);
  update_moments<DType::f32>(w, g, m, v, k, begin, end);
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(AdamwUpdateRange);

namespace {
using adamw_detail::Coeffs;
using adamw_detail::make_coeffs;
using adamw_detail::Mode;
using adamw_detail::Weights;

void run(const Weights& w, const Tensor& grad, Tensor& m, Tensor& v, const Coeffs& k) {
  const float* pg = grad.data<float>();
  void* pm = m.raw_data();
  void* pv = v.raw_data();
  const DType state = m.dtype();
  parallel_ranges(m.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(AdamwUpdateRange)(w, pg, pm, pv, state, k, begin, end);
  });
}

// grad f32, m and v both f32 or both bf16, as many elements as param; t from 1. param's dtype
// is checked by the caller.
void check_state(std::string_view op, const Tensor& param, const Tensor& grad, const Tensor& m,
                 const Tensor& v, int64_t t) {
  expect_any_shape(param, op, "param", param.dtype());
  expect_any_shape(grad, op, "grad");
  MEMFIT_CHECK(m.defined() && v.defined(), op, "m and v must be defined");
  MEMFIT_CHECK_DTYPE((m.dtype() == DType::f32 || m.dtype() == DType::bf16) &&
                         v.dtype() == m.dtype(),
                     op, "m and v must be both f32 or both bf16, got {} and {}",
                     dtype_name(m.dtype()), dtype_name(v.dtype()));
  expect_any_shape(m, op, "m", m.dtype());
  expect_any_shape(v, op, "v", v.dtype());
  const int64_t n = param.numel();
  MEMFIT_CHECK_SHAPE(grad.numel() == n && m.numel() == n && v.numel() == n, op,
                     "param {}, grad {}, m {} and v {} must have the same element count",
                     param.shape(), grad.shape(), m.shape(), v.shape());
  MEMFIT_CHECK(t >= 1, op, "step t = {} must count from 1", t);
}

}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& h,
                  int64_t t, float grad_scale) {
  KernelScope timed("adamw_update");
  constexpr std::string_view op = "adamw_update";
  expect_any_shape(param, op, "param");
  check_state(op, param, grad, m, v, t);
  const Coeffs k = make_coeffs(h, t, grad_scale);
  const Weights w{Mode::f32, DType::f32, param.data<float>(), nullptr, 0, 0};
  run(w, grad, m, v, k);
}

void adamw_update_master(Tensor& master, Tensor& working, const Tensor& grad, Tensor& m, Tensor& v,
                         const AdamWHyper& h, int64_t t, float grad_scale) {
  KernelScope timed("adamw_update_master");
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
  const Weights w{Mode::master, working.dtype(), master.data<float>(), working.raw_data(), 0, 0};
  run(w, grad, m, v, k);
}

void adamw_update_stochastic(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                             const AdamWHyper& h, int64_t t, float grad_scale, uint64_t seed,
                             uint64_t index0) {
  KernelScope timed("adamw_update_stochastic");
  constexpr std::string_view op = "adamw_update_stochastic";
  expect_any_shape(param, op, "param", DType::bf16);
  check_state(op, param, grad, m, v, t);
  const Coeffs k = make_coeffs(h, t, grad_scale);
  // A fresh stream every step: the same bits each step would round each element the same way.
  const uint64_t step_seed = seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(t));
  const Weights w{Mode::stochastic, DType::bf16, nullptr, param.raw_data(), step_seed, index0};
  run(w, grad, m, v, k);
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
