// NF4 weights (kernels/cpu/nf4.h, quant_matmul.h) against dense ones: the forward product of
// 2048 rows (1 x 2048 tokens) with a LLaMA-7B-sized weight, 4096 x 4096 (attention) and
// 4096 x 11008 / 11008 x 4096 (the MLP's down and up projections; out x in), the NF4 weight
// dequantized a tile at a time into the GEMM against the same GEMM on a dense weight of the
// compute type; the input gradient likewise; and dequantization alone in bytes written per
// second. Each product takes a last argument bf16 = 0 (f32 compute) or 1 (bf16 compute, the
// route the model takes on this CPU: oneDNN's bf16 GEMM from AVX512_BF16, else widened to f32,
// labelled). The first argument set of each is a tiny smoke shape (R = 16, 256 x 256), for
// checking that the benchmark runs:
//     memfit_bench --benchmark_filter='Nf4.*/(R:16|OC:256)/' --benchmark_min_time=0.01
#include <benchmark/benchmark.h>

#include <random>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/kernels/cpu/nf4.h"
#include "memfit/kernels/cpu/quant_matmul.h"

namespace memfit::kernels {
namespace {

// Weight-like values (normal, 0.02) or inputs (normal, 1) of `dtype`.
Tensor normal(MemoryPool& pool, Shape shape, DType dtype, float sigma, Category category) {
  Tensor f = Tensor::empty(pool, shape, DType::f32, category, "bench.f32");
  std::mt19937 gen(5);
  std::normal_distribution<float> dist(0.0f, sigma);
  float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = dist(gen);
  if (dtype == DType::f32) return f;
  Tensor t = Tensor::empty(pool, shape, dtype, category, "bench.values");
  convert(t, f);
  return t;
}

// The weight quantized into a pool buffer of nf4_bytes.
struct QuantizedWeight {
  Tensor storage;
  Nf4Weight w;
};
QuantizedWeight quantized(MemoryPool& pool, int64_t OC, int64_t IC) {
  Tensor dense = normal(pool, {OC, IC}, DType::f32, 0.02f, Category::workspace);
  QuantizedWeight q;
  q.storage = Tensor::empty(pool, {static_cast<int64_t>(nf4_bytes(OC, IC))}, DType::u8,
                            Category::params, "nf4");
  q.w = Nf4Weight::view(q.storage, OC, IC);
  Tensor absmax = Tensor::empty(
      pool, {static_cast<int64_t>(nf4_quantize_scratch_bytes(OC, IC) / 4)}, DType::f32,
      Category::workspace, "nf4.absmax");
  nf4_quantize(dense, q.w, absmax);
  return q;
}

DType compute_type(benchmark::State& state, int arg) {
  const DType t = state.range(arg) ? DType::bf16 : DType::f32;
  if (matmul_widens(t)) state.SetLabel("widened to f32");
  return t;
}

Tensor nf4_scratch(MemoryPool& pool, int64_t R, int64_t IC, int64_t OC, DType t) {
  return Tensor::empty(pool, {static_cast<int64_t>(quant_matmul_scratch_bytes(R, IC, OC, t))},
                       DType::u8, Category::workspace, "ws.quant");
}

// Args: R, OC, IC, bf16. out (R, OC) in the compute type = inp @ W^T, W NF4.
void BM_Nf4Matmul_Forward(benchmark::State& state) {
  const int64_t R = state.range(0), OC = state.range(1), IC = state.range(2);
  const DType t = compute_type(state, 3);
  MemoryPool pool;
  QuantizedWeight q = quantized(pool, OC, IC);
  Tensor inp = normal(pool, {R, IC}, t, 1.0f, Category::activations);
  Tensor out = Tensor::empty(pool, {R, OC}, t, Category::activations, "out");
  Tensor ws = nf4_scratch(pool, R, IC, OC, t);
  for (auto _ : state) {
    quant_matmul_forward(out, inp, q.w, ws);
    benchmark::DoNotOptimize(out.raw_data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * R * IC * OC * state.iterations(), benchmark::Counter::kIsRate);
}

// The same product on a dense weight of the compute type (the bf16 / f32 GEMM the NF4 one is
// measured against).
void BM_Nf4Matmul_DenseForward(benchmark::State& state) {
  const int64_t R = state.range(0), OC = state.range(1), IC = state.range(2);
  const DType t = compute_type(state, 3);
  MemoryPool pool;
  Tensor w = normal(pool, {OC, IC}, t, 0.02f, Category::params);
  Tensor inp = normal(pool, {R, IC}, t, 1.0f, Category::activations);
  Tensor out = Tensor::empty(pool, {R, OC}, t, Category::activations, "out");
  Tensor none, ws;
  if (matmul_widens(t))
    ws = Tensor::empty(pool, {static_cast<int64_t>(matmul_widened_scratch_bytes(R, IC, OC) / 4)},
                       DType::f32, Category::workspace, "ws.widen");
  for (auto _ : state) {
    if (ws.defined())
      matmul_forward_widened(out, inp, w, none, ws);
    else
      matmul_forward(out, inp, w, none);
    benchmark::DoNotOptimize(out.raw_data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * R * IC * OC * state.iterations(), benchmark::Counter::kIsRate);
}

// dinp (R, IC) in the compute type = dout (R, OC) @ W, W NF4.
void BM_Nf4Matmul_BackwardInput(benchmark::State& state) {
  const int64_t R = state.range(0), OC = state.range(1), IC = state.range(2);
  const DType t = compute_type(state, 3);
  MemoryPool pool;
  QuantizedWeight q = quantized(pool, OC, IC);
  Tensor dout = normal(pool, {R, OC}, t, 1.0f, Category::activations);
  Tensor dinp = Tensor::empty(pool, {R, IC}, t, Category::activations, "dinp");
  Tensor ws = nf4_scratch(pool, R, IC, OC, t);
  for (auto _ : state) {
    quant_matmul_backward_input(dinp, dout, q.w, ws);
    benchmark::DoNotOptimize(dinp.raw_data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * R * IC * OC * state.iterations(), benchmark::Counter::kIsRate);
}

// Args: OC, IC, bf16: the whole weight dequantized (bytes of the output written per second).
void BM_Nf4Dequantize(benchmark::State& state) {
  const int64_t OC = state.range(0), IC = state.range(1);
  const DType t = state.range(2) ? DType::bf16 : DType::f32;
  MemoryPool pool;
  QuantizedWeight q = quantized(pool, OC, IC);
  Tensor out = Tensor::empty(pool, {OC, IC}, t, Category::workspace, "out");
  for (auto _ : state) {
    nf4_dequantize_rows(q.w, 0, out);
    benchmark::ClobberMemory();
  }
  state.counters["bytes/s"] =
      benchmark::Counter(static_cast<double>(out.nbytes()) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

void product_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"R", "OC", "IC", "bf16"});
  for (int64_t bf16 : {0, 1}) {
    b->Args({16, 256, 256, bf16});      // smoke
    b->Args({2048, 4096, 4096, bf16});  // attention projection
    b->Args({2048, 4096, 11008, bf16}); // MLP down
    b->Args({2048, 11008, 4096, bf16}); // MLP up / gate
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Nf4Matmul_Forward)->Apply(product_shapes);
BENCHMARK(BM_Nf4Matmul_DenseForward)->Apply(product_shapes);
BENCHMARK(BM_Nf4Matmul_BackwardInput)->Apply(product_shapes);
BENCHMARK(BM_Nf4Dequantize)
    ->ArgNames({"OC", "IC", "bf16"})
    ->Args({256, 256, 0})
    ->Args({4096, 4096, 0})
    ->Args({4096, 4096, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
