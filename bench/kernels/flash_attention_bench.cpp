// Flash attention next to plain attention (attention.h) on GPT-2 small's attention shape
// (B = 1, 12 heads of 64) for T = 256 .. 4096: time, FLOP/s and the bytes each keeps for
// backward. docs/notes/flash-attention.md quotes these numbers.
#include <benchmark/benchmark.h>

#include <random>

#include "memfit/kernels/cpu/attention.h"
#include "memfit/kernels/cpu/flash_attention.h"

namespace memfit::kernels {
namespace {

constexpr int64_t kB = 1, kHeadSize = 64;
constexpr int kHeads = 12;
constexpr int64_t kC = kHeads * kHeadSize;

// FLOPs of the products causal attention needs, 2 per multiply-add over the T (T + 1) / 2
// visible (query, key) pairs of each head: forward QK^T and PV; backward dV, dP, dQ, dK.
// Flash's recomputation of QK^T in backward is not counted, so FLOP/s compare like for like.
double forward_flops(int64_t T) { return 2.0 * 2.0 * kB * kHeads * kHeadSize * T * (T + 1) / 2.0; }
double forward_backward_flops(int64_t T) { return 3.0 * forward_flops(T); }

void fill_random(Tensor& t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  if (t.dtype() == DType::bf16) {
    auto* p = static_cast<uint16_t*>(t.raw_data());
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = bf16_from_f32(dist(rng));
  } else {
    float* p = t.data<float>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = dist(rng);
  }
}

size_t plain_workspace_bytes(int64_t T) {
  return attention_backward_workspace_bytes(kB, T, kC, kHeads);
}

struct Buffers {
  MemoryPool pool;
  Tensor qkv, out, dout, dqkv, saved, workspace;  // saved: lse (flash) or att (plain)
  Tensor forward_workspace;                       // flash only
  Buffers(int64_t T, DType dtype, bool flash) {
    auto make = [&](Shape s, DType dt, Category cat, const char* tag) {
      return Tensor::empty(pool, s, dt, cat, tag);
    };
    qkv = make({kB, T, 3 * kC}, dtype, Category::activations, "qkv");
    out = make({kB, T, kC}, dtype, Category::activations, "out");
    dout = make({kB, T, kC}, dtype, Category::workspace, "dout");
    dqkv = make({kB, T, 3 * kC}, dtype, Category::workspace, "dqkv");
    saved = flash ? make({kB, kHeads, T}, DType::f32, Category::activations, "lse")
                  : make({kB, kHeads, T, T}, DType::f32, Category::activations, "att");
    const size_t ws = flash ? flash_attention_backward_workspace_bytes(kB, T, kC, kHeads, dtype)
                            : plain_workspace_bytes(T);
    workspace = make({static_cast<int64_t>((ws + 3) / 4)}, DType::f32, Category::workspace, "ws");
    if (flash) {
      const size_t fws = flash_attention_forward_workspace_bytes(kB, T, kC, kHeads, dtype);
      forward_workspace = make({static_cast<int64_t>((fws + 3) / 4)}, DType::f32,
                               Category::workspace, "forward ws");
    }
    fill_random(qkv, 1);
    fill_random(dout, 2);
  }
  size_t saved_bytes() const { return out.nbytes() + saved.nbytes(); }
};

void set_counters(benchmark::State& state, const Buffers& b, double flops) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["saved_bytes"] = static_cast<double>(b.saved_bytes());
  state.counters["workspace_bytes"] = static_cast<double>(b.workspace.nbytes());
  if (b.forward_workspace.defined()) {
    state.counters["forward_workspace_bytes"] = static_cast<double>(b.forward_workspace.nbytes());
  }
}

void flash_forward(benchmark::State& state, DType dtype) {
  const int64_t T = state.range(0);
  Buffers b(T, dtype, true);
  for (auto _ : state) {
    flash_attention_forward(b.out, b.saved, b.qkv, b.forward_workspace, kHeads);
    benchmark::ClobberMemory();
  }
  set_counters(state, b, forward_flops(T));
}

void flash_forward_backward(benchmark::State& state, DType dtype) {
  const int64_t T = state.range(0);
  Buffers b(T, dtype, true);
  for (auto _ : state) {
    flash_attention_forward(b.out, b.saved, b.qkv, b.forward_workspace, kHeads);
    flash_attention_backward(b.dqkv, b.dout, b.qkv, b.out, b.saved, b.workspace, kHeads);
    benchmark::ClobberMemory();
  }
  set_counters(state, b, forward_backward_flops(T));
}

// Backward alone, on the saved out and lse of one forward: what the dq scheme changes.
void flash_backward(benchmark::State& state, DType dtype) {
  const int64_t T = state.range(0);
  Buffers b(T, dtype, true);
  flash_attention_forward(b.out, b.saved, b.qkv, b.forward_workspace, kHeads);
  for (auto _ : state) {
    flash_attention_backward(b.dqkv, b.dout, b.qkv, b.out, b.saved, b.workspace, kHeads);
    benchmark::ClobberMemory();
  }
  set_counters(state, b, forward_backward_flops(T) - forward_flops(T));
}

void BM_FlashAttention_Forward(benchmark::State& state) { flash_forward(state, DType::f32); }
void BM_FlashAttention_ForwardBackward(benchmark::State& state) {
  flash_forward_backward(state, DType::f32);
}
void BM_FlashAttention_Backward(benchmark::State& state) { flash_backward(state, DType::f32); }
void BM_FlashAttention_ForwardBf16(benchmark::State& state) { flash_forward(state, DType::bf16); }
void BM_FlashAttention_ForwardBackwardBf16(benchmark::State& state) {
  flash_forward_backward(state, DType::bf16);
}

void BM_FlashAttention_BackwardBf16(benchmark::State& state) {
  flash_backward(state, DType::bf16);
}

void BM_PlainAttention_Forward(benchmark::State& state) {
  const int64_t T = state.range(0);
  Buffers b(T, DType::f32, false);
  for (auto _ : state) {
    attention_forward(b.out, b.saved, b.qkv, kHeads);
    benchmark::ClobberMemory();
  }
  set_counters(state, b, forward_flops(T));
}

void BM_PlainAttention_ForwardBackward(benchmark::State& state) {
  const int64_t T = state.range(0);
  Buffers b(T, DType::f32, false);
  for (auto _ : state) {
    attention_forward(b.out, b.saved, b.qkv, kHeads);
    attention_backward(b.dqkv, b.dout, b.qkv, b.saved, b.workspace, kHeads);
    benchmark::ClobberMemory();
  }
  set_counters(state, b, forward_backward_flops(T));
}

void sequence_lengths(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(2)->Range(256, 4096)->Unit(benchmark::kMillisecond)->UseRealTime();
}

// Side by side: flash, then plain, for each of forward and forward + backward.
BENCHMARK(BM_FlashAttention_Forward)->Apply(sequence_lengths);
BENCHMARK(BM_PlainAttention_Forward)->Apply(sequence_lengths);
BENCHMARK(BM_FlashAttention_ForwardBackward)->Apply(sequence_lengths);
BENCHMARK(BM_PlainAttention_ForwardBackward)->Apply(sequence_lengths);
BENCHMARK(BM_FlashAttention_ForwardBf16)->Apply(sequence_lengths);
BENCHMARK(BM_FlashAttention_ForwardBackwardBf16)->Apply(sequence_lengths);
BENCHMARK(BM_FlashAttention_Backward)->Apply(sequence_lengths);
BENCHMARK(BM_FlashAttention_BackwardBf16)->Apply(sequence_lengths);

}  // namespace
}  // namespace memfit::kernels
