// Micro-benchmarks of plain causal attention: forward, and forward + backward, at the GPT-2 small
// training shape and at growing T for one sequence. FLOP/s count only the causal half of each
// (T, T) product; saved_bytes is the (B, NH, T, T) probabilities kept for backward, the memory
// that flash attention removes. BM_Attention_ForwardOneDnn is the alternative that was measured
// against the micro-kernel: per-head oneDNN GEMMs (full T x T, strided q/k/v) around the same
// softmax. At B=8, T=256, NH=6, hs=64 on one core it took 6.5 ms against the micro-kernel's
// 4.8 ms (each 256x256x64 oneDNN call runs at ~90 GFLOP/s but cannot skip the upper half), and
// on two busy cores its many small parallel regions made it several times slower still.
#include <benchmark/benchmark.h>

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "memfit/kernels/cpu/attention.h"
#include "memfit/kernels/cpu/attention_tile.h"
#include "memfit/kernels/cpu/matmul.h"

namespace memfit::kernels {
namespace {

struct Setup {
  int64_t B, T, NH, hs, C;
  MemoryPool pool;
  Tensor qkv, out, att;

  explicit Setup(const benchmark::State& state)
      : B(state.range(0)), T(state.range(1)), NH(state.range(2)), hs(state.range(3)),
        C(NH * hs) {
    qkv = Tensor::empty(pool, {B, T, 3 * C}, DType::f32, Category::activations, "qkv");
    float* p = qkv.data<float>();
    for (int64_t i = 0; i < qkv.numel(); ++i) p[i] = std::sin(0.37f * static_cast<float>(i));
    out = Tensor::empty(pool, {B, T, C}, DType::f32, Category::activations, "out");
    att = Tensor::empty(pool, {B, NH, T, T}, DType::f32, Category::activations, "att");
  }
  // Multiply-adds of the causal half of the two forward products (q k^T and P v), times 2.
  double forward_flops() const { return 2.0 * 2.0 * B * NH * (T * (T + 1) / 2.0) * hs; }
  void report(benchmark::State& state, double flops_per_iter) const {
    state.counters["FLOP/s"] =
        benchmark::Counter(flops_per_iter * state.iterations(), benchmark::Counter::kIsRate);
    state.counters["saved_bytes"] = static_cast<double>(att.nbytes());
  }
};

void BM_Attention_Forward(benchmark::State& state) {
  Setup s(state);
  for (auto _ : state) {
    attention_forward(s.out, s.att, s.qkv, static_cast<int>(s.NH));
    benchmark::DoNotOptimize(s.out.raw_data());
  }
  s.report(state, s.forward_flops());
}

// Backward has four products of the forward's size: dP, dq, dk, dv.
void BM_Attention_ForwardBackward(benchmark::State& state) {
  Setup s(state);
  const int nh = static_cast<int>(s.NH);
  Tensor dout = Tensor::empty(s.pool, {s.B, s.T, s.C}, DType::f32, Category::activations, "dout");
  Tensor dqkv =
      Tensor::empty(s.pool, {s.B, s.T, 3 * s.C}, DType::f32, Category::activations, "dqkv");
  const size_t ws_bytes = attention_backward_workspace_bytes(s.B, s.T, s.C, nh);
  Tensor ws = Tensor::empty(s.pool, {static_cast<int64_t>(ws_bytes / sizeof(float))}, DType::f32,
                            Category::workspace, "attn.ws");
  std::fill(dout.data<float>(), dout.data<float>() + dout.numel(), 0.01f);
  for (auto _ : state) {
    attention_forward(s.out, s.att, s.qkv, nh);
    attention_backward(dqkv, dout, s.qkv, s.att, ws, nh);
    benchmark::DoNotOptimize(dqkv.raw_data());
  }
  s.report(state, 3.0 * s.forward_flops());
  state.counters["workspace_bytes"] = static_cast<double>(ws_bytes);
}

// The alternative: one oneDNN GEMM per head for q k^T (no causal skipping) and one for P v.
void BM_Attention_ForwardOneDnn(benchmark::State& state) {
  Setup s(state);
  const int64_t T = s.T, C = s.C, hs = s.hs, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (auto _ : state) {
    for (int64_t bh = 0; bh < s.B * s.NH; ++bh) {
      const int64_t b = bh / s.NH, h = bh % s.NH;
      const float* q = s.qkv.data<float>() + b * T * C3 + h * hs;
      float* S = s.att.data<float>() + bh * T * T;
      gemm(false, true, T, T, hs, scale, q, C3, q + C, C3, 0.0f, S, T);
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        float* row = S + t * T;
        const float inv = 1.0f / tile::exp_shift_sum(row, t + 1, tile::row_max(row, t + 1));
        for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
        std::fill(row + t + 1, row + T, 0.0f);
      }
      gemm(false, false, T, hs, T, 1.0f, S, T, q + 2 * C, C3, 0.0f,
           s.out.data<float>() + b * T * C + h * hs, C);
    }
    benchmark::DoNotOptimize(s.out.raw_data());
  }
  s.report(state, s.forward_flops());
}

void attention_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "T", "NH", "hs"});
  b->Args({8, 256, 6, 64});   // GPT-2 small-ish: C = 384
  b->Args({4, 256, 12, 64});  // GPT-2 124M heads: C = 768
  for (int64_t T : {256, 512, 1024, 2048}) b->Args({1, T, 12, 64});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Attention_Forward)->Apply(attention_shapes);
BENCHMARK(BM_Attention_ForwardBackward)->Apply(attention_shapes);
BENCHMARK(BM_Attention_ForwardOneDnn)->Apply(attention_shapes);

}  // namespace
}  // namespace memfit::kernels
