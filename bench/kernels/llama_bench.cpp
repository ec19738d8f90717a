// The LLaMA family's element-wise and row kernels at Llama 2 7B / TinyLlama shapes (2048
// tokens): RMSNorm, RoPE and SwiGLU, in bytes moved per second, since all three are
// memory-bound.
#include <benchmark/benchmark.h>

#include <random>

#include "memfit/kernels/cpu/rmsnorm.h"
#include "memfit/kernels/cpu/rope.h"
#include "memfit/kernels/cpu/swiglu.h"

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

void bytes_counter(benchmark::State& state, double bytes) {
  state.counters["bytes/s"] = benchmark::Counter(
      bytes * state.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

void BM_RmsNorm_Forward(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  MemoryPool pool;
  Tensor inp = filled(pool, {R, C}, 1), w = filled(pool, {C}, 2);
  Tensor out = filled(pool, {R, C}, 3), rstd = filled(pool, {R}, 4);
  for (auto _ : state) {
    rmsnorm_forward(out, rstd, inp, w, 1e-5f);
    benchmark::ClobberMemory();
  }
  bytes_counter(state, 2.0 * R * C * sizeof(float));  // read inp, write out
}

void BM_RmsNorm_Backward(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  MemoryPool pool;
  Tensor inp = filled(pool, {R, C}, 1), w = filled(pool, {C}, 2);
  Tensor out = filled(pool, {R, C}, 3), rstd = filled(pool, {R}, 4);
  rmsnorm_forward(out, rstd, inp, w, 1e-5f);
  Tensor dout = filled(pool, {R, C}, 5), dinp = filled(pool, {R, C}, 6), dw = filled(pool, {C}, 7);
  for (auto _ : state) {
    rmsnorm_backward(dinp, dw, dout, inp, w, rstd);
    benchmark::ClobberMemory();
  }
  bytes_counter(state, 4.0 * R * C * sizeof(float));  // read dout, inp, dinp; write dinp
}

// range: tokens, query heads, key/value heads, head size.
void BM_Rope_Forward(benchmark::State& state) {
  const int64_t T = state.range(0), hs = state.range(3);
  const AttentionHeads heads(static_cast<int>(state.range(1)), static_cast<int>(state.range(2)));
  MemoryPool pool;
  Tensor table = filled(pool, {T, hs}, 1);
  rope_table(table, rope_inv_freq(static_cast<int>(hs), 10000.0));
  Tensor qkv = filled(pool, {1, T, heads.qkv_width(hs)}, 2);
  for (auto _ : state) {
    rope_forward(qkv, table, heads);
    benchmark::ClobberMemory();
  }
  bytes_counter(state, 2.0 * T * (heads.q + heads.kv) * hs * sizeof(float));  // q and k, in place
}

void BM_Swiglu_Forward(benchmark::State& state) {
  const int64_t N = state.range(0), F = state.range(1);
  MemoryPool pool;
  Tensor gate_up = filled(pool, {N, 2 * F}, 1), out = filled(pool, {N, F}, 2);
  for (auto _ : state) {
    swiglu_forward(out, gate_up);
    benchmark::ClobberMemory();
  }
  bytes_counter(state, 3.0 * N * F * sizeof(float));
}

void BM_Swiglu_Backward(benchmark::State& state) {
  const int64_t N = state.range(0), F = state.range(1);
  MemoryPool pool;
  Tensor gate_up = filled(pool, {N, 2 * F}, 1), dout = filled(pool, {N, F}, 2);
  Tensor dgate_up = filled(pool, {N, 2 * F}, 3);
  for (auto _ : state) {
    swiglu_backward(dgate_up, dout, gate_up);
    benchmark::ClobberMemory();
  }
  bytes_counter(state, 5.0 * N * F * sizeof(float));
}

BENCHMARK(BM_RmsNorm_Forward)->Args({2048, 2048})->Args({2048, 4096})->UseRealTime();
BENCHMARK(BM_RmsNorm_Backward)->Args({2048, 2048})->Args({2048, 4096})->UseRealTime();
BENCHMARK(BM_Rope_Forward)->Args({2048, 32, 4, 64})->Args({2048, 32, 32, 128})->UseRealTime();
BENCHMARK(BM_Swiglu_Forward)->Args({2048, 5632})->UseRealTime();
BENCHMARK(BM_Swiglu_Backward)->Args({2048, 5632})->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
