// Micro-benchmarks of the linear layer at GPT-2 shapes (small: C = 384, and 124M: C = 768, with
// B*T = 2048 rows; the LM head at 256 rows), forward and backward, reported in FLOP/s so they
// can be held against oneDNN's raw GEMM rate on this machine.
#include <benchmark/benchmark.h>

#include "memfit/kernels/cpu/matmul.h"

namespace memfit::kernels {
namespace {

Tensor filled(MemoryPool& pool, Shape shape, Category category, const char* tag) {
  Tensor t = Tensor::empty(pool, shape, DType::f32, category, tag);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
  return t;
}

// Args: rows R, in features IC, out features OC, bias (0/1).
void BM_Matmul_Forward(benchmark::State& state) {
  const int64_t R = state.range(0), IC = state.range(1), OC = state.range(2);
  MemoryPool pool;
  Tensor inp = filled(pool, {R, IC}, Category::activations, "inp");
  Tensor w = filled(pool, {OC, IC}, Category::params, "w");
  Tensor bias = state.range(3) ? filled(pool, {OC}, Category::params, "b") : Tensor();
  Tensor out = Tensor::empty(pool, {R, OC}, DType::f32, Category::activations, "out");
  for (auto _ : state) {
    matmul_forward(out, inp, w, bias);
    benchmark::DoNotOptimize(out.raw_data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * R * IC * OC * state.iterations(),
                                                benchmark::Counter::kIsRate);
}

// dinp = dout @ w, dweight += dout^T @ inp, dbias += column sums.
void BM_Matmul_Backward(benchmark::State& state) {
  const int64_t R = state.range(0), IC = state.range(1), OC = state.range(2);
  MemoryPool pool;
  Tensor inp = filled(pool, {R, IC}, Category::activations, "inp");
  Tensor w = filled(pool, {OC, IC}, Category::params, "w");
  Tensor dout = filled(pool, {R, OC}, Category::activations, "dout");
  Tensor dinp = Tensor::empty(pool, {R, IC}, DType::f32, Category::activations, "dinp");
  Tensor dw = Tensor::empty(pool, {OC, IC}, DType::f32, Category::grads, "dw");
  Tensor db = state.range(3) ? Tensor::empty(pool, {OC}, DType::f32, Category::grads, "db")
                             : Tensor();
  for (auto _ : state) {
    matmul_backward(dinp, dw, db, dout, inp, w);
    benchmark::DoNotOptimize(dw.raw_data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(4.0 * R * IC * OC * state.iterations(),
                                                benchmark::Counter::kIsRate);
}

// The raw oneDNN rate on a square product, for reference.
void BM_Matmul_Gemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  MemoryPool pool;
  Tensor a = filled(pool, {n, n}, Category::workspace, "a");
  Tensor b = filled(pool, {n, n}, Category::workspace, "b");
  Tensor c = Tensor::empty(pool, {n, n}, DType::f32, Category::workspace, "c");
  for (auto _ : state) {
    gemm(false, false, n, n, n, 1.0f, a.data<float>(), b.data<float>(), 0.0f, c.data<float>());
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n * state.iterations(), benchmark::Counter::kIsRate);
}

void linear_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"R", "IC", "OC", "bias"});
  for (int64_t C : {384, 768}) {
    b->Args({2048, C, 3 * C, 1});  // attention qkv
    b->Args({2048, C, C, 1});      // attention projection
    b->Args({2048, C, 4 * C, 1});  // MLP up
    b->Args({2048, 4 * C, C, 1});  // MLP down
  }
  b->Args({256, 768, 50304, 0});  // LM head, one chunk of rows
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Matmul_Forward)->Apply(linear_shapes);
BENCHMARK(BM_Matmul_Backward)->Apply(linear_shapes);
BENCHMARK(BM_Matmul_Gemm)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
