// Cross-entropy over GPT-2's padded vocabulary (Vp = 50304, V = 50257) for blocks of 256 to
// 2048 rows, the sizes the chunked LM head hands it: exps per second (the cost that matters)
// and bytes per second.
#include <benchmark/benchmark.h>

#include <random>

#include "memfit/kernels/cpu/crossentropy.h"

namespace memfit::kernels {
namespace {

constexpr int64_t kVp = 50304, kV = 50257;

struct Inputs {
  Tensor logits, targets, losses;
};

Inputs make_inputs(MemoryPool& pool, int64_t R) {
  Inputs in;
  in.logits = Tensor::empty(pool, {R, kVp}, DType::f32, Category::workspace, "bench.logits");
  in.targets = Tensor::empty(pool, {R}, DType::i32, Category::activations, "bench.targets");
  in.losses = Tensor::empty(pool, {R}, DType::f32, Category::activations, "bench.losses");
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  float* x = in.logits.data<float>();
  for (int64_t i = 0; i < R * kVp; ++i) x[i] = dist(gen);
  int32_t* t = in.targets.data<int32_t>();
  for (int64_t r = 0; r < R; ++r) t[r] = static_cast<int32_t>(gen() % kV);
  return in;
}

void set_counters(benchmark::State& state, int64_t R, double passes) {
  state.counters["exp/s"] = benchmark::Counter(static_cast<double>(R) * kV * state.iterations(),
                                               benchmark::Counter::kIsRate);
  state.counters["bytes/s"] =
      benchmark::Counter(passes * R * kVp * sizeof(float) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

void BM_CrossEntropy_Forward(benchmark::State& state) {
  const int64_t R = state.range(0);
  MemoryPool pool;
  Inputs in = make_inputs(pool, R);
  for (auto _ : state) {
    crossentropy_forward(in.losses, in.logits, in.targets, kV);
    benchmark::ClobberMemory();
  }
  set_counters(state, R, 1.0);  // logits read once from memory
}

// Overwrites the logits with their gradient each time; later iterations run on gradients,
// which costs the same.
void BM_CrossEntropy_ForwardBackward(benchmark::State& state) {
  const int64_t R = state.range(0);
  MemoryPool pool;
  Inputs in = make_inputs(pool, R);
  for (auto _ : state) {
    crossentropy_forward_backward(in.losses, in.logits, in.targets, kV, 1.0f / R);
    benchmark::ClobberMemory();
  }
  set_counters(state, R, 2.0);  // read once, written once
}

BENCHMARK(BM_CrossEntropy_Forward)->RangeMultiplier(2)->Range(256, 2048)->UseRealTime();
BENCHMARK(BM_CrossEntropy_ForwardBackward)->RangeMultiplier(2)->Range(256, 2048)->UseRealTime();

}  // namespace
}  // namespace memfit::kernels
