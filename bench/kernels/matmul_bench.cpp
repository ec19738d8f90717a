// Micro-benchmarks of the linear layer at GPT-2 shapes (small: C = 384, and 124M: C = 768, with
// B*T = 2048 rows; the LM head at 256 rows), forward and backward, reported in FLOP/s so they
// can be held against oneDNN's raw GEMM rate on this machine.
#include <benchmark/benchmark.h>

#include <string>

#include "memfit/kernels/cpu/dnnl_gemm.h"
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

// Every GEMM of a gpt2 8 x 256 step (no bias; f32 output), in oneDNN's first choice (brgemm
// on AVX-512) and in its GEMM-based kernel (gemm:jit), from which memfit's rule picks (Note
// [GEMM kernel] in dnnl_gemm.cpp). Args: the row of kStepGemms, bf16 operands (0/1), kernel (0:
// first choice, 1: gemm-based; the label names the one that ran).
struct StepGemm {
  int64_t M, N, K;
  bool ta, tb, acc;
};
constexpr StepGemm kStepGemms[] = {
    {256, 50304, 768, false, true, false},  // LM head forward, a 256-row chunk
    {256, 768, 50304, false, false, false},  // its dinp
    {50304, 768, 256, true, false, true},    // its dweight
    {2048, 2304, 768, false, true, false},   // qkv forward
    {2048, 768, 2304, false, false, false},  // its dinp
    {2304, 768, 2048, true, false, true},    // its dweight
    {2048, 768, 768, false, true, false},    // attention projection forward
    {2048, 768, 768, false, false, false},   // its dinp
    {768, 768, 2048, true, false, true},     // its dweight
    {2048, 3072, 768, false, true, false},   // MLP up forward
    {2048, 768, 3072, false, false, false},  // its dinp
    {3072, 768, 2048, true, false, true},    // its dweight
    {2048, 768, 3072, false, true, false},   // MLP down forward
    {2048, 3072, 768, false, false, false},  // its dinp
    {768, 3072, 2048, true, false, true},    // its dweight
};

// Times one product of a table below, its operands of type t, in kernel k.
void time_gemm(benchmark::State& state, const StepGemm& g, DType t,
               dnnl_gemm::GemmSpec::Kernel k) {
  dnnl_gemm::GemmSpec spec;
  spec.M = g.M, spec.N = g.N, spec.K = g.K, spec.trans_a = g.ta, spec.trans_b = g.tb;
  spec.lda = g.ta ? g.M : g.K, spec.ldb = g.tb ? g.K : g.N, spec.ldc = g.N;
  spec.beta = g.acc ? 1.0f : 0.0f;
  spec.a_type = spec.b_type = t;
  spec.kernel = k;
  MemoryPool pool;
  Tensor a = filled(pool, {g.M * g.K}, Category::activations, "a");
  Tensor b = filled(pool, {g.K * g.N}, Category::activations, "b");
  if (t == DType::bf16) {  // the same values, rounded, in the first half of each buffer
    for (Tensor* x : {&a, &b}) {
      float* p = x->data<float>();
      auto* h = static_cast<uint16_t*>(x->raw_data());
      for (int64_t i = 0; i < x->numel(); ++i) h[i] = bf16_from_f32(p[i]);
    }
  }
  Tensor c = filled(pool, {g.M * g.N}, Category::activations, "c");
  for (auto _ : state) {
    dnnl_gemm::execute(spec, a.raw_data(), b.raw_data(), c.raw_data());
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.SetLabel(std::string(dnnl_gemm::implementation(spec)) + (g.ta ? " A^T" : "") +
                 (g.tb ? " B^T" : "") + (g.acc ? " +=" : ""));
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * g.M * g.N * g.K * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["scratch_MiB"] = double(dnnl_gemm::scratch_bytes(spec)) / (1 << 20);
}

dnnl_gemm::GemmSpec::Kernel kernel_arg(int64_t arg) {
  return arg ? dnnl_gemm::GemmSpec::Kernel::gemm : dnnl_gemm::GemmSpec::Kernel::first;
}

void BM_Gemm_StepKernels(benchmark::State& state) {
  time_gemm(state, kStepGemms[state.range(0)], state.range(1) ? DType::bf16 : DType::f32,
            kernel_arg(state.range(2)));
}

// The bf16 LM head's products at the rows the step runs them (the forward's 128-row chunk,
// d(norm)'s 256 rows, the gradient's 512-row group), at widths 384 and 768: as memfit lays out
// its operands, and transposed (logits^T = W x^T, the weight read as a plain A; the gradient
// kept as dlogits^T), in oneDNN's first choice and gemm:jit (Note [GEMM kernel]; docs/
// benchmarks.md, "bf16 weight gradients in gemm:jit"). Args: the row, kernel (0 first, 1 gemm).
constexpr StepGemm kHeadGemms[] = {
    {128, 50304, 384, false, true, false},   // forward: logits = x W^T
    {50304, 128, 384, false, true, false},   //   transposed: logits^T = W x^T
    {256, 384, 50304, false, false, false},  // d(norm) = dlogits W
    {256, 384, 50304, true, false, false},   //   from dlogits^T
    {50304, 384, 512, true, false, true},    // d(head) += dlogits^T x
    {50304, 384, 512, false, false, true},   //   from dlogits^T: A plain
    {128, 50304, 768, false, true, false},   // the same at width 768
    {50304, 128, 768, false, true, false},
    {256, 768, 50304, false, false, false},
    {256, 768, 50304, true, false, false},
    {50304, 768, 512, true, false, true},
    {50304, 768, 512, false, false, true},
};

void BM_Gemm_LmHeadForms(benchmark::State& state) {
  if (!dnnl_gemm::bf16_native()) {
    state.SkipWithError("oneDNN has no bf16 matmul below AVX-512");
    return;
  }
  time_gemm(state, kHeadGemms[state.range(0)], DType::bf16, kernel_arg(state.range(1)));
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
BENCHMARK(BM_Gemm_StepKernels)
    ->ArgNames({"gemm", "bf16", "kernel"})
    ->ArgsProduct({benchmark::CreateDenseRange(0, 14, 1), {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Gemm_LmHeadForms)
    ->ArgNames({"gemm", "kernel"})
    ->ArgsProduct({benchmark::CreateDenseRange(0, 11, 1), {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Matmul_Gemm)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
