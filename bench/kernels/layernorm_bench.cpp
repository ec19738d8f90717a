// LayerNorm at GPT-2 shapes (2048 rows of C = 384 or 768): bytes moved per second, the
// number that says how close a memory-bound kernel is to the machine's bandwidth.
#include <benchmark/benchmark.h>

#include <random>

#include "memfit/kernels/cpu/layernorm.h"

namespace memfit::kernels {
namespace {

Tensor filled(MemoryPool& pool, Shape shape, uint32_t seed) {
  Tensor t = Tensor::empty(pool, shape, DType::f32, Category::activations, "bench");
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

void BM_LayerNorm_Forward(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  MemoryPool pool;
  Tensor inp = filled(pool, {R, C}, 1), w = filled(pool, {C}, 2), b = filled(pool, {C}, 3);
  Tensor out = filled(pool, {R, C}, 4), mean = filled(pool, {R}, 5), rstd = filled(pool, {R}, 6);
  for (auto _ : state) {
    layernorm_forward(out, mean, rstd, inp, w, b);
    benchmark::ClobberMemory();
  }
  // Read inp, write out (weights and statistics are small).
  const double bytes = 2.0 * R * C * sizeof(float);
  state.counters["bytes/s"] = benchmark::Counter(
      bytes * state.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

void BM_LayerNorm_Backward(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  MemoryPool pool;
  Tensor inp = filled(pool, {R, C}, 1), w = filled(pool, {C}, 2), b = filled(pool, {C}, 3);
  Tensor out = filled(pool, {R, C}, 4), mean = filled(pool, {R}, 5), rstd = filled(pool, {R}, 6);
  layernorm_forward(out, mean, rstd, inp, w, b);
  Tensor dout = filled(pool, {R, C}, 7), dinp = filled(pool, {R, C}, 8);
  Tensor dw = filled(pool, {C}, 9), db = filled(pool, {C}, 10);
  for (auto _ : state) {
    layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd);
    benchmark::ClobberMemory();
  }
  // Read dout, inp and dinp; write dinp.
  const double bytes = 4.0 * R * C * sizeof(float);
  state.counters["bytes/s"] = benchmark::Counter(
      bytes * state.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

BENCHMARK(BM_LayerNorm_Forward)->Args({2048, 384})->Args({2048, 768})->UseRealTime();
BENCHMARK(BM_LayerNorm_Backward)->Args({2048, 384})->Args({2048, 768})->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
