// The costs around mixed precision that are not GEMMs: conversions (bytes/s; they run at memory
// bandwidth), attention with bf16 qkv / probabilities against f32 (the widening into f32
// scratch is O(T hs) next to O(T^2 hs) work), and the instruction rate of vdpbf16ps against
// vfmadd231ps, the measurement behind attention's choice to widen rather than use bf16 dot
// products (docs/notes/mixed-precision.md).
#include <benchmark/benchmark.h>

#include "memfit/core/cpu.h"
#include "memfit/kernels/cpu/attention.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/half_vec.h"

#if defined(__x86_64__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace memfit::kernels {
namespace {

Tensor filled(MemoryPool& pool, Shape shape, DType dtype) {
  Tensor f = Tensor::empty(pool, shape, DType::f32, Category::workspace, "bench");
  float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
  if (dtype == DType::f32) return f;
  Tensor t = Tensor::empty(pool, shape, dtype, Category::workspace, "bench");
  convert(t, f);
  return t;
}

// Args: elements, source dtype, destination dtype (DType values), stochastic (0/1).
void BM_Convert(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto src_t = static_cast<DType>(state.range(1)), dst_t = static_cast<DType>(state.range(2));
  MemoryPool pool;
  Tensor src = filled(pool, {n}, src_t);
  Tensor dst = Tensor::empty(pool, {n}, dst_t, Category::workspace, "dst");
  uint64_t seed = 0;
  for (auto _ : state) {
    if (state.range(3)) convert_stochastic(dst, src, ++seed);
    else convert(dst, src);
    benchmark::DoNotOptimize(dst.raw_data());
  }
  state.SetLabel(fmt::format("{}->{}{}", dtype_name(src_t), dtype_name(dst_t),
                             state.range(3) ? " stochastic" : ""));
  state.counters["bytes/s"] = benchmark::Counter(
      static_cast<double>(src.nbytes() + dst.nbytes()) * state.iterations(),
      benchmark::Counter::kIsRate);
}

// Args: B, T, bf16 (0: all f32; 1: qkv, att, out, dout and dqkv bf16). C = 768, 12 heads.
void BM_Attention_Mixed(benchmark::State& state) {
  const int64_t B = state.range(0), T = state.range(1), C = 768;
  const int NH = 12;
  const DType t = state.range(2) ? DType::bf16 : DType::f32;
  MemoryPool pool;
  Tensor qkv = filled(pool, {B, T, 3 * C}, t), dout = filled(pool, {B, T, C}, t);
  Tensor out = Tensor::empty(pool, {B, T, C}, t, Category::activations, "out");
  Tensor att = Tensor::empty(pool, {B, NH, T, T}, t, Category::activations, "att");
  Tensor dqkv = Tensor::empty(pool, {B, T, 3 * C}, t, Category::activations, "dqkv");
  const size_t fwd = attention_forward_workspace_bytes(B, T, C, NH, t, t, t);
  const size_t bwd = attention_backward_workspace_bytes(B, T, C, NH, t, t, t, t);
  Tensor ws = Tensor::empty(pool, {static_cast<int64_t>(std::max(fwd, bwd) / 4 + 1)}, DType::f32,
                            Category::workspace, "ws");
  for (auto _ : state) {
    attention_forward(out, att, qkv, ws, NH);
    attention_backward(dqkv, dout, qkv, att, ws, NH);
    benchmark::DoNotOptimize(dqkv.raw_data());
  }
  // Six (T, T) x hs products a head (two forward, four backward), 2 T^2 hs FLOPs each, half of
  // it below the causal diagonal: 6 T^2 hs a head.
  state.counters["FLOP/s"] = benchmark::Counter(
      6.0 * B * NH * T * T * (C / NH) * state.iterations(), benchmark::Counter::kIsRate);
}

#if defined(__x86_64__)
// 24 independent accumulators, so the rate is the instructions' throughput, not their latency.
// Compiled for AVX512_BF16 by attribute (the build is portable); run only where the CPU has it.
template <bool kBf16>
__attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl"))) void instruction_rate_body(
    benchmark::State& state) {
  __m512 acc[24];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  __m512 a = _mm512_set1_ps(1e-8f), b = _mm512_set1_ps(1e-8f);
  __m512bh ab = (__m512bh)_mm512_set1_epi16(0x3f80), bb = ab;
  constexpr int64_t kIters = 1 << 20;
  for (auto _ : state) {
    for (int64_t it = 0; it < kIters; ++it) {
#pragma GCC unroll 24
      for (int i = 0; i < 24; ++i) {
        if constexpr (kBf16) acc[i] = _mm512_dpbf16_ps(acc[i], ab, bb);
        else acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
      }
      asm volatile("" : "+v"(a), "+v"(b), "+v"(ab), "+v"(bb));
    }
  }
  for (__m512& x : acc) benchmark::DoNotOptimize(x);
  // Multiply-adds per instruction: 16 lanes, two bf16 products per lane for vdpbf16ps.
  state.counters["FLOP/s"] = benchmark::Counter(
      24.0 * kIters * (kBf16 ? 64 : 32) * state.iterations(), benchmark::Counter::kIsRate);
}
template <bool kBf16>
void instruction_rate(benchmark::State& state) {
  if (!cpu::has(cpu::Isa::avx512_bf16)) {
    state.SkipWithError("needs AVX512_BF16 (cpu::has; MEMFIT_MAX_ISA may cap it)");
    return;
  }
  instruction_rate_body<kBf16>(state);
}
void BM_Isa_Fma(benchmark::State& state) { instruction_rate<false>(state); }
void BM_Isa_Dpbf16(benchmark::State& state) { instruction_rate<true>(state); }
BENCHMARK(BM_Isa_Fma)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Isa_Dpbf16)->Unit(benchmark::kMillisecond);
#endif

constexpr auto kF32 = static_cast<int64_t>(DType::f32), kBf16 = static_cast<int64_t>(DType::bf16),
               kF16 = static_cast<int64_t>(DType::f16);

BENCHMARK(BM_Convert)
    ->ArgNames({"n", "src", "dst", "sr"})
    ->Args({1 << 24, kF32, kBf16, 0})
    ->Args({1 << 24, kF32, kBf16, 1})
    ->Args({1 << 24, kBf16, kF32, 0})
    ->Args({1 << 24, kF32, kF16, 0})
    ->Args({1 << 24, kF16, kF32, 0})
    // In-cache sizes: a block of the LM head's weight widened by the capped bf16 head (2048 x
    // 768) and a GPT-2 MLP weight (3072 x 768), as the step widens them between GEMMs.
    ->Args({2048 * 768, kBf16, kF32, 0})
    ->Args({3072 * 768, kBf16, kF32, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Attention_Mixed)
    ->ArgNames({"B", "T", "bf16"})
    ->Args({1, 1024, 0})
    ->Args({1, 1024, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
