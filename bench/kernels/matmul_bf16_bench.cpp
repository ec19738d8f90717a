// BF16 against FP32 for the linear layer at GPT-2 124M shapes (B*T = 2048 rows, C = 768: qkv,
// attention projection, MLP up and down; the LM head at 256 rows of a 50304 vocabulary),
// forward and backward, in FLOP/s; and oneDNN's bare BF16 and FP32 GEMM rate at 2048^3 for
// reference. Each benchmark takes a last argument bf16 = 0 (f32 operands) or 1 (bf16 operands,
// f32 accumulation) so that the two sit side by side. Backward writes dinp in f32, as the
// model does where dinp feeds a LayerNorm backward. bf16 runs the route the model takes on this
// CPU: oneDNN's bf16 kernels from AVX-512 up, else widened through the f32 GEMM
// (matmul_widened.h; AVX2-only CPUs and MEMFIT_MAX_ISA=avx2), the label says which.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cstring>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/cpu/matmul_widened.h"

namespace memfit::kernels {
namespace {

// A tensor of `dtype` with small deterministic values (generated in f32, then converted).
Tensor filled(MemoryPool& pool, Shape shape, DType dtype, Category category, const char* tag) {
  Tensor f = Tensor::empty(pool, shape, DType::f32, category, tag);
  float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
  if (dtype == DType::f32) return f;
  Tensor t = Tensor::empty(pool, shape, dtype, category, tag);
  convert(t, f);
  return t;
}

DType operand_type(benchmark::State& state, int arg) {
  const DType t = state.range(arg) ? DType::bf16 : DType::f32;
  if (matmul_widens(t)) state.SetLabel("widened to f32");
  return t;
}

// The widening scratch where the route needs one (an empty tensor otherwise).
Tensor route_scratch(MemoryPool& pool, DType t, int64_t R, int64_t IC, int64_t OC) {
  if (!matmul_widens(t)) return Tensor();
  const auto floats = static_cast<int64_t>((matmul_widened_scratch_bytes(R, IC, OC) + 3) / 4);
  return Tensor::empty(pool, {floats}, DType::f32, Category::workspace, "ws.widen");
}

void forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& bias, Tensor& ws) {
  if (ws.defined())
    matmul_forward_widened(out, inp, w, bias, ws);
  else
    matmul_forward(out, inp, w, bias);
}

// Before each timed product of BM_Matmul_Bf16ForwardCold the team writes a buffer larger than
// the last-level cache (the 16-core Xeon guest reports 300 MiB of L3), so that the product meets
// its operands out of every cache, as a step meets most of them (the activations it reads were
// written a layer or a phase ago, the weights a whole step ago). Against BM_Matmul_Bf16Forward,
// what the caches are worth to each shape; against the step's kernel times (Note [Kernel
// times]), how much of the gap between a GEMM alone and the same GEMM in a step is that.
constexpr size_t kEvictBytes = size_t{768} << 20;

// Args: rows R, in features IC, out features OC, bias (0/1), bf16 (0/1). out is f32. `cold`:
// the caches are emptied before each product, and only the product is timed (manual time).
void forward_product(benchmark::State& state, bool cold) {
  const int64_t R = state.range(0), IC = state.range(1), OC = state.range(2);
  const DType t = operand_type(state, 4);
  MemoryPool pool;
  Tensor inp = filled(pool, {R, IC}, t, Category::activations, "inp");
  Tensor w = filled(pool, {OC, IC}, t, Category::params, "w");
  Tensor bias = state.range(3) ? filled(pool, {OC}, DType::f32, Category::params, "b") : Tensor();
  Tensor out = Tensor::empty(pool, {R, OC}, DType::f32, Category::activations, "out");
  Tensor ws = route_scratch(pool, t, R, IC, OC);
  Tensor evict = cold ? Tensor::empty(pool, {static_cast<int64_t>(kEvictBytes)}, DType::u8,
                                      Category::workspace, "evict")
                      : Tensor();
  constexpr int64_t kBlock = int64_t{1} << 20;
  int fill = 0;
  for (auto _ : state) {
    if (cold) {
      auto* e = static_cast<unsigned char*>(evict.raw_data());
      fill = (fill + 1) & 0x7f;
#pragma omp parallel for
      for (int64_t b = 0; b < static_cast<int64_t>(kEvictBytes) / kBlock; ++b)
        std::memset(e + b * kBlock, fill, kBlock);
    }
    const auto t0 = std::chrono::steady_clock::now();
    forward(out, inp, w, bias, ws);
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(out.raw_data());
    if (cold) state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * R * IC * OC * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_Matmul_Bf16Forward(benchmark::State& state) { forward_product(state, false); }
void BM_Matmul_Bf16ForwardCold(benchmark::State& state) { forward_product(state, true); }

// dinp (f32) = dout @ w, dweight (f32) += dout^T @ inp, dbias (f32) += column sums.
void BM_Matmul_Bf16Backward(benchmark::State& state) {
  const int64_t R = state.range(0), IC = state.range(1), OC = state.range(2);
  const DType t = operand_type(state, 4);
  MemoryPool pool;
  Tensor inp = filled(pool, {R, IC}, t, Category::activations, "inp");
  Tensor w = filled(pool, {OC, IC}, t, Category::params, "w");
  Tensor dout = filled(pool, {R, OC}, t, Category::activations, "dout");
  Tensor dinp = Tensor::empty(pool, {R, IC}, DType::f32, Category::activations, "dinp");
  Tensor dw = Tensor::empty(pool, {OC, IC}, DType::f32, Category::grads, "dw");
  Tensor db =
      state.range(3) ? Tensor::empty(pool, {OC}, DType::f32, Category::grads, "db") : Tensor();
  Tensor ws = route_scratch(pool, t, R, IC, OC);
  for (auto _ : state) {
    if (ws.defined())
      matmul_backward_widened(dinp, dw, db, dout, inp, w, ws);
    else
      matmul_backward(dinp, dw, db, dout, inp, w);
    benchmark::DoNotOptimize(dw.raw_data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(4.0 * R * IC * OC * state.iterations(), benchmark::Counter::kIsRate);
}

// The bare oneDNN rate on a square product (out = a @ b^T through matmul_forward, no bias).
void BM_Matmul_Bf16Gemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const DType t = operand_type(state, 1);
  MemoryPool pool;
  Tensor a = filled(pool, {n, n}, t, Category::workspace, "a");
  Tensor b = filled(pool, {n, n}, t, Category::workspace, "b");
  Tensor c = Tensor::empty(pool, {n, n}, DType::f32, Category::workspace, "c");
  Tensor none, ws = route_scratch(pool, t, n, n, n);
  for (auto _ : state) {
    forward(c, a, b, none, ws);
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n * state.iterations(), benchmark::Counter::kIsRate);
}

void gpt2_shape_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"R", "IC", "OC", "bias", "bf16"});
  for (int64_t bf16 : {0, 1}) {
    b->Args({2048, 768, 2304, 1, bf16});  // attention qkv
    b->Args({2048, 768, 768, 1, bf16});   // attention projection
    b->Args({2048, 768, 3072, 1, bf16});  // MLP up
    b->Args({2048, 3072, 768, 1, bf16});  // MLP down
    b->Args({256, 768, 50304, 0, bf16});  // LM head, one chunk of rows
  }
}

void gpt2_shapes(benchmark::internal::Benchmark* b) {
  gpt2_shape_args(b);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Matmul_Bf16Forward)->Apply(gpt2_shapes);
BENCHMARK(BM_Matmul_Bf16Backward)->Apply(gpt2_shapes);
// A fixed count: the eviction between products is not timed, and a time target would repeat it
// thousands of times.
BENCHMARK(BM_Matmul_Bf16ForwardCold)
    ->Apply(gpt2_shape_args)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(20)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true)
    ->UseManualTime();
BENCHMARK(BM_Matmul_Bf16Gemm)
    ->ArgNames({"n", "bf16"})
    ->Args({2048, 0})
    ->Args({2048, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
