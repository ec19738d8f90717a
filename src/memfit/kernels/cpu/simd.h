// Run-time choice of the kernels' instruction set. Every hand-vectorised kernel source is
// compiled once per Highway target (AVX3, AVX2, scalar; see docs/notes/simd-dispatch.md) and
// its public functions call the chosen one through MEMFIT_SIMD_DISPATCH, which first applies the
// cap: on the first call, the targets above cpu::max_isa() (MEMFIT_MAX_ISA) are disabled, so
// MEMFIT_MAX_ISA=avx2 makes an AVX-512 machine run the AVX2 code.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace memfit::kernels {

// The Highway target the dispatch chose under the cap in effect: "AVX3", "AVX2", "SCALAR", ...
// For tests, benchmarks and the run's start-up line.
std::string_view simd_target();

// simd-inl.h's vector math on the target the dispatch chose, for tests: y[i] = f(x[i]).
namespace simd_test {
size_t lanes();  // floats in a vector
void exp_n(const float* x, float* y, int64_t n);
void exp2_n(const float* x, float* y, int64_t n);
void tanh_n(const float* x, float* y, int64_t n);
double sum_lanes_pd(const float* x);  // the first lanes() floats, added in double
}  // namespace simd_test

namespace detail {
extern std::atomic<bool> simd_ready;
// Disables the Highway targets above cpu::max_isa(); idempotent and thread-safe.
void simd_init();
}  // namespace detail

// Called before every dispatch: a relaxed load once the cap is applied.
inline void simd_ensure_init() {
  if (!detail::simd_ready.load(std::memory_order_acquire)) detail::simd_init();
}

}  // namespace memfit::kernels

// HWY_DYNAMIC_DISPATCH after the cap is in place: MEMFIT_SIMD_DISPATCH(Fn)(args...).
#define MEMFIT_SIMD_DISPATCH(FN) \
  (::memfit::kernels::simd_ensure_init(), HWY_DYNAMIC_DISPATCH(FN))
