// The memory-bound element-wise kernels at GPT-2 small shapes: GELU over the MLP activation
// (2048 x 3072), the residual add (2048 x 768) and an AdamW step over 7.1M parameters (one
// block's MLP weights), in bytes moved per second.
#include <benchmark/benchmark.h>

#include <random>
#include <string>

#include "memfit/kernels/cpu/adamw.h"
#include "memfit/kernels/cpu/gelu.h"
#include "memfit/kernels/cpu/residual.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
namespace {

// The SIMD target every kernel benchmark in this binary runs on, in the JSON's context (it
// follows MEMFIT_MAX_ISA; docs/notes/simd-dispatch.md).
const bool kContextAdded = [] {
  benchmark::AddCustomContext("simd_target", std::string(simd_target()));
  return true;
}();

Tensor filled(MemoryPool& pool, int64_t n, uint32_t seed, float lo = -3.0f, float hi = 3.0f) {
  Tensor t = Tensor::empty(pool, {n}, DType::f32, Category::activations, "bench");
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = dist(gen);
  return t;
}

void bytes_counter(benchmark::State& state, double bytes_per_iter) {
  state.counters["bytes/s"] =
      benchmark::Counter(bytes_per_iter * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1024);
}

void BM_Gelu_Forward(benchmark::State& state) {
  const int64_t n = state.range(0);
  MemoryPool pool;
  Tensor inp = filled(pool, n, 1), out = filled(pool, n, 2);
  for (auto _ : state) {
    gelu_forward(out, inp);
    benchmark::ClobberMemory();
  }
  bytes_counter(state, 2.0 * n * sizeof(float));
}

void BM_Gelu_Backward(benchmark::State& state) {
  const int64_t n = state.range(0);
  MemoryPool pool;
  Tensor inp = filled(pool, n, 1), dout = filled(pool, n, 2), dinp = filled(pool, n, 3);
  for (auto _ : state) {
    gelu_backward(dinp, inp, dout);
    benchmark::ClobberMemory();
  }
  bytes_counter(state, 3.0 * n * sizeof(float));
}

void BM_Residual_Forward(benchmark::State& state) {
  const int64_t n = state.range(0);
  MemoryPool pool;
  Tensor a = filled(pool, n, 1), b = filled(pool, n, 2), out = filled(pool, n, 3);
  for (auto _ : state) {
    residual_forward(out, a, b);
    benchmark::ClobberMemory();
  }
  bytes_counter(state, 3.0 * n * sizeof(float));
}

void BM_AdamW_Update(benchmark::State& state) {
  const int64_t n = state.range(0);
  MemoryPool pool;
  Tensor p = filled(pool, n, 1), g = filled(pool, n, 2), m = filled(pool, n, 3, -0.1f, 0.1f),
         v = filled(pool, n, 4, 0.0f, 0.1f);
  const AdamWHyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  int64_t t = 0;
  for (auto _ : state) {
    adamw_update(p, g, m, v, h, ++t);
    benchmark::ClobberMemory();
  }
  bytes_counter(state, 7.0 * n * sizeof(float));  // p, g, m, v in; p, m, v out
}

BENCHMARK(BM_Gelu_Forward)->Arg(2048 * 3072)->UseRealTime();
BENCHMARK(BM_Gelu_Backward)->Arg(2048 * 3072)->UseRealTime();
BENCHMARK(BM_Residual_Forward)->Arg(2048 * 768)->UseRealTime();
BENCHMARK(BM_AdamW_Update)->Arg(2 * 768 * 3072)->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
