// Activation compression's kernels (kernels/cpu/act_quant.h) at GPT-2 small's largest saved
// activation, the MLP pre-activation (2048 x 3072) in bf16, and the saved residual in f32
// (2048 x 768): quantising to int8 and FP8 E4M3 and restoring, in bytes moved per second (the
// planner's step-time model prices them at the element-wise rate, Note [Activation
// compression]).
#include <benchmark/benchmark.h>

#include <random>

#include "memfit/kernels/cpu/act_quant.h"
#include "memfit/kernels/cpu/convert.h"

namespace memfit::kernels {
namespace {

Tensor values(MemoryPool& pool, int64_t n, DType dtype) {
  Tensor f = Tensor::empty(pool, {n}, DType::f32, Category::activations, "bench.f32");
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) f.data<float>()[i] = dist(gen);
  if (dtype == DType::f32) return f;
  Tensor t = Tensor::empty(pool, {n}, dtype, Category::activations, "bench.values");
  convert(t, f);
  return t;
}

// Bytes one pass moves: the values in their type, a byte of code each, a scale per 64.
double pass_bytes(int64_t n, DType dtype) {
  return double(n) * (dtype_size(dtype) + 1) + 4.0 * act_blocks(n);
}

void run(benchmark::State& state, DType dtype, DType codes_type, bool restore) {
  const int64_t n = state.range(0);
  MemoryPool pool;
  Tensor x = values(pool, n, dtype);
  Tensor codes = Tensor::empty(pool, {n}, codes_type, Category::activations, "bench.codes");
  Tensor scales = Tensor::empty(pool, {act_blocks(n)}, DType::f32, Category::activations, "s");
  act_quantize(x, codes, scales);
  for (auto _ : state) {
    if (restore)
      act_dequantize(codes, scales, x);
    else
      act_quantize(x, codes, scales);
    benchmark::ClobberMemory();
  }
  state.counters["bytes/s"] =
      benchmark::Counter(pass_bytes(n, dtype) * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1024);
}

void BM_ActQuant_Int8Bf16(benchmark::State& s) { run(s, DType::bf16, DType::i8, false); }
void BM_ActQuant_Fp8Bf16(benchmark::State& s) { run(s, DType::bf16, DType::u8, false); }
void BM_ActQuant_Int8F32(benchmark::State& s) { run(s, DType::f32, DType::i8, false); }
void BM_ActDequant_Int8Bf16(benchmark::State& s) { run(s, DType::bf16, DType::i8, true); }
void BM_ActDequant_Fp8Bf16(benchmark::State& s) { run(s, DType::bf16, DType::u8, true); }
void BM_ActDequant_Int8F32(benchmark::State& s) { run(s, DType::f32, DType::i8, true); }

BENCHMARK(BM_ActQuant_Int8Bf16)->Arg(2048 * 3072)->UseRealTime();
BENCHMARK(BM_ActQuant_Fp8Bf16)->Arg(2048 * 3072)->UseRealTime();
BENCHMARK(BM_ActQuant_Int8F32)->Arg(2048 * 768)->UseRealTime();
BENCHMARK(BM_ActDequant_Int8Bf16)->Arg(2048 * 3072)->UseRealTime();
BENCHMARK(BM_ActDequant_Fp8Bf16)->Arg(2048 * 3072)->UseRealTime();
BENCHMARK(BM_ActDequant_Int8F32)->Arg(2048 * 768)->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
