// Whether oneDNN's bf16 matmul gains from weights stored in its own blocked layout, at GPT-2
// 124M's linear shapes: a measurement for a design not built (docs/benchmarks.md, "Weights in
// oneDNN's layout"). memfit passes row-major weights, so oneDNN packs them inside every call
// (into the VNNI pairs that AVX512_BF16's dot products and AMX's tiles read). Kept weights in
// the blocked layout would need a second copy of the bf16 working weights (the backward's
// d(input) = dout @ W reads W the other way round, a layout of its own), so the question is
// how much each call loses, on which CPU. Three variants of one product, M x K times K x N into
// f32: packed = 0, the weight row-major as memfit passes it; 1, the weight reordered once into
// the primitive's preferred layout outside the timed loop; 2, reordered in every iteration
// (packing just in time into a workspace). transposed = 1 is the forward (out = x W^T, W stored
// (N, K)), 0 the backward's d(input) (W stored (K, N)). oneDNN's API directly: this measures
// oneDNN, not a memfit path. Where oneDNN has no bf16 matmul (AVX2, MEMFIT_MAX_ISA=avx2) it
// skips with that message.
#include <benchmark/benchmark.h>

#include <cstring>
#include <dnnl.hpp>

#include "memfit/kernels/cpu/dnnl_gemm.h"

namespace memfit::kernels {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

void BM_Matmul_Bf16PackedWeights(benchmark::State& state) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  const bool transposed = state.range(3) != 0;
  const int packed = static_cast<int>(state.range(4));
  if (!dnnl_gemm::bf16_native()) {
    state.SkipWithError("oneDNN has no bf16 matmul on this CPU (or under MEMFIT_MAX_ISA)");
    return;
  }
  // The engine, stream and primitive are oneDNN's own objects: this benchmark holds no memfit
  // tensors, only oneDNN memory objects, which allocate through oneDNN.
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const dnnl::memory::desc a_md({M, K}, dt::bf16, tag::ab), c_md({M, N}, dt::f32, tag::ab);
  const dnnl::memory::desc w_plain({K, N}, dt::bf16, transposed ? tag::ba : tag::ab);
  const dnnl::memory::desc w_any({K, N}, dt::bf16, tag::any);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, packed ? w_any : w_plain, c_md),
                                        eng);
  dnnl::memory a(a_md, eng), c(c_md, eng), w_rows(w_plain, eng);
  std::memset(a.get_data_handle(), 0, a_md.get_size());
  std::memset(w_rows.get_data_handle(), 0, w_plain.get_size());
  dnnl::memory w = w_rows;
  dnnl::reorder pack;
  if (packed) {
    w = dnnl::memory(pd.weights_desc(), eng);
    pack = dnnl::reorder(w_rows, w);
    pack.execute(stream, w_rows, w);
  }
  const dnnl::matmul product(pd);
  for (auto _ : state) {
    if (packed == 2) pack.execute(stream, w_rows, w);
    product.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, c}});
    stream.wait();
  }
  state.SetLabel(pd.impl_info_str());
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * M * K * N * state.iterations(), benchmark::Counter::kIsRate);
}

// Args: M, K, N, transposed, packed.
void gpt2_linear_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "transposed", "packed"});
  for (int64_t packed : {0, 1, 2}) {
    b->Args({2048, 768, 2304, 1, packed});   // qkv forward
    b->Args({2048, 768, 3072, 1, packed});   // MLP up forward
    b->Args({2048, 3072, 768, 1, packed});   // MLP down forward
    b->Args({2048, 3072, 768, 0, packed});   // MLP up backward: d(input) = dout @ W
    b->Args({128, 768, 50304, 1, packed});   // LM head logits, one 128-row chunk
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Matmul_Bf16PackedWeights)->Apply(gpt2_linear_shapes);

}  // namespace
}  // namespace memfit::kernels
