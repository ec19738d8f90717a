// Optimizer step cost: time per parameter and state bytes per parameter for each optimizer, on
// a ~10M-parameter GPT-2-shaped layout (4 layers, width 384, 6 heads, 256 positions, vocabulary
// 8192), so the planner's and the docs' per-parameter numbers come from one place.
// Counters: ns_per_param (wall time of one step / parameters), params_per_s (its inverse: elements
// updated a second), state_bytes_per_param. APOLLO's (rank 256, capped at 384 here, and
// apollo-mini's rank 1) include drawing the projections and the projection GEMMs. GaLore's
// (rank 128) are the steps between projectors, the projections and back; galore-svd is galore
// with a new projector every step (--optim-proj-gap 1), so that its SVDs' cost shows (divide
// the difference by the projection gap for a run's share).
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>

#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/adam_mini.h"
#include "memfit/optim/adamw4bit.h"
#include "memfit/optim/adamw8bit.h"
#include "memfit/optim/apollo.h"
#include "memfit/optim/galore.h"
#include "memfit/optim/lion.h"
#include "memfit/optim/lion8bit.h"
#include "memfit/optim/sgd.h"

// AdamW's kernel (kernels/cpu/adamw.cpp) comes from another branch; benchmark AdamW once it is
// in the tree.
#if __has_include("memfit/kernels/cpu/adamw.cpp")
#define MEMFIT_BENCH_ADAMW 1
#include "memfit/optim/adamw.h"
#endif

namespace memfit {
namespace {

ModelConfig bench_config() {
  ModelConfig c;
  c.n_layer = 4;
  c.n_head = 6;
  c.d_model = 384;
  c.max_seq_len = 256;
  c.vocab_size = 8192;
  c.finalize();
  return c;
}

std::unique_ptr<Optimizer> construct(const OptimConfig& c, const ParamLayout& layout,
                                     MemoryPool& pool) {
#ifdef MEMFIT_BENCH_ADAMW
  if (c.name == "adamw") return std::make_unique<AdamW>(c, layout, pool);
#endif
  if (c.name == "adamw4bit") return std::make_unique<AdamW4bit>(c, layout, pool);
  if (c.name == "adamw8bit") return std::make_unique<AdamW8bit>(c, layout, pool);
  if (c.name == "lion") return std::make_unique<Lion>(c, layout, pool);
  if (c.name == "lion8bit") return std::make_unique<Lion8bit>(c, layout, pool);
  if (c.name == "adam-mini") return std::make_unique<AdamMini>(c, layout, pool);
  if (is_apollo(c.name)) return std::make_unique<Apollo>(c, layout, &pool);
  if (is_galore(c.name)) return std::make_unique<Galore>(c, layout, &pool);
  return std::make_unique<Sgd>(c, layout, pool);
}

void fill(Tensor& t, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
}

void BM_OptimizerStep(benchmark::State& state, std::string name) {
  const ModelConfig gc = bench_config();
  const ParamLayout layout(gc);
  MemoryPool pool;
  Tensor params = Tensor::empty(pool, {layout.total()}, DType::f32, Category::params, "params");
  Tensor grads = Tensor::empty(pool, {layout.total()}, DType::f32, Category::grads, "grads");
  fill(params, 1, 0.02f);
  fill(grads, 2, 1e-3f);
  OptimConfig c;
  c.name = name;
  c.n_head = gc.n_head;
  if (name == "galore-svd") {  // an SVD every step
    c.name = "galore";
    c.proj_gap = 1;
  }
  if (name == "adamw-bf16-state") {  // --optim-state-dtype bf16
    c.name = "adamw";
    c.state_dtype = DType::bf16;
  }
  auto opt = construct(c, layout, pool);
  opt->step(params, grads, 1e-4f, 1.0f);  // first touch of the state

  double seconds = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    opt->step(params, grads, 1e-4f, 1.0f);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::ClobberMemory();
  }
  const double n = static_cast<double>(layout.total());
  state.counters["params"] = n;
  state.counters["ns_per_param"] = seconds * 1e9 / (n * static_cast<double>(state.iterations()));
  state.counters["params_per_s"] = n * static_cast<double>(state.iterations()) / seconds;
  state.counters["state_bytes_per_param"] = static_cast<double>(opt->state_bytes()) / n;
}

const bool registered = [] {
  std::vector<std::string> names = {"adamw8bit", "lion",   "lion8bit",   "adam-mini", "sgd",
                                    "adamw4bit", "apollo", "apollo-mini", "galore",
                                    "galore8bit", "galore-svd"};
#ifdef MEMFIT_BENCH_ADAMW
  names.insert(names.begin(), {"adamw", "adamw-bf16-state"});
#endif
  for (const std::string& n : names) {
    std::string id = n;
    for (char& ch : id)
      if (ch == '-') ch = '_';
    benchmark::RegisterBenchmark(("BM_OptimizerStep_" + id).c_str(), BM_OptimizerStep, n)
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.5)
        ->UseRealTime();
  }
  return true;
}();

}  // namespace
}  // namespace memfit
