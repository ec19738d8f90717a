// The cap (cpu::max_isa()) applied to Highway's dispatch, and simd_target().
#include "memfit/kernels/cpu/simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
const char* TargetNameHere() { return hwy::TargetName(HWY_TARGET); }

size_t LanesHere() { return hn::Lanes(DF()); }

// fn 0: exp, 1: exp2, 2: tanh, over whole vectors and a tail.
void MathN(int fn, const float* x, float* y, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto f = [&](VF v) { return fn == 0 ? exp(d, v) : fn == 1 ? exp2(d, v) : tanh(d, v); };
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(f(hn::LoadU(d, x + i)), d, y + i);
  if (i < n) store_n<DType::f32>(d, f(load_n<DType::f32>(d, x + i, n - i)), y + i, n - i);
}

double SumLanesPd(const float* x) { return sum_lanes_pd(DF(), hn::LoadU(DF(), x)); }
}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <mutex>

#include "memfit/core/cpu.h"

namespace memfit::kernels {
HWY_EXPORT(TargetNameHere);
HWY_EXPORT(LanesHere);
HWY_EXPORT(MathN);
HWY_EXPORT(SumLanesPd);

namespace detail {
std::atomic<bool> simd_ready{false};

void simd_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Highway detects the CPU itself; the cap only ever removes targets. AVX3_DL (and any later
    // AVX-512 target) counts as avx512: none of them uses AMX, and AVX512_BF16 dot products are
    // chosen by cpu::has() where they are used, not through Highway.
    int64_t disabled = 0;
    switch (cpu::max_isa()) {
      case cpu::Isa::scalar:
        disabled = ~static_cast<int64_t>(HWY_SCALAR | HWY_EMU128);
        break;
      case cpu::Isa::avx2:
        disabled = HWY_AVX3 | HWY_AVX3_DL;
        break;
      default:
        break;
    }
    if (disabled != 0) hwy::DisableTargets(disabled);
    simd_ready.store(true, std::memory_order_release);
  });
}
}  // namespace detail

std::string_view simd_target() { return MEMFIT_SIMD_DISPATCH(TargetNameHere)(); }

namespace simd_test {
size_t lanes() { return MEMFIT_SIMD_DISPATCH(LanesHere)(); }
void exp_n(const float* x, float* y, int64_t n) { MEMFIT_SIMD_DISPATCH(MathN)(0, x, y, n); }
void exp2_n(const float* x, float* y, int64_t n) { MEMFIT_SIMD_DISPATCH(MathN)(1, x, y, n); }
void tanh_n(const float* x, float* y, int64_t n) { MEMFIT_SIMD_DISPATCH(MathN)(2, x, y, n); }
double sum_lanes_pd(const float* x) { return MEMFIT_SIMD_DISPATCH(SumLanesPd)(x); }
}  // namespace simd_test

}  // namespace memfit::kernels
#endif  // HWY_ONCE
