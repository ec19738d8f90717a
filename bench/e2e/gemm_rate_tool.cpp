// The bare oneDNN matmul rate on this machine, for the FLOP-rate target of the mixed-precision
// benchmark (bench/e2e/precision_vs_pytorch.py): a square N^3 GEMM in bf16 (AMX) and f32, the
// best of `reps` runs after a warmup, in whichever of oneDNN's kernels is faster (its first
// choice or its GEMM-based one, Note [GEMM kernel]): a step is held against the best the
// library does, not only the kernel memfit picks. Prints one JSON object. Where oneDNN has no
// bf16 matmul (AVX2-only CPUs, MEMFIT_MAX_ISA=avx2), bf16_tflops is null: bf16 runs at the f32
// rate there.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/memory/pool.h"
#include "memfit/memory/tensor.h"

using namespace memfit;

namespace {

double best_ms(const kernels::dnnl_gemm::GemmSpec& s, const void* a, const void* b, void* c,
               int reps) {
  kernels::dnnl_gemm::execute(s, a, b, c);  // warmup: primitive creation, page faults
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    kernels::dnnl_gemm::execute(s, a, b, c);
    best = std::min(best, std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::stoll(argv[1]) : 2048;
  const int reps = argc > 2 ? std::stoi(argv[2]) : 5;
  MemoryPool pool;
  nlohmann::json j;
  j["n"] = n;
  j["onednn_isa"] = kernels::dnnl_gemm::isa();
  j["bf16_tflops"] = nullptr;
  for (DType dt : {DType::bf16, DType::f32}) {
    if (dt == DType::bf16 && !kernels::dnnl_gemm::bf16_native()) continue;
    Tensor a = Tensor::empty(pool, {n, n}, dt, Category::workspace, "a");
    Tensor b = Tensor::empty(pool, {n, n}, dt, Category::workspace, "b");
    Tensor c = Tensor::empty(pool, {n, n}, DType::f32, Category::workspace, "c");
    kernels::dnnl_gemm::GemmSpec s;
    s.M = s.N = s.K = n;
    s.lda = s.ldb = s.ldc = n;
    s.a_type = s.b_type = dt;
    double ms = 1e300;
    for (auto k : {kernels::dnnl_gemm::GemmSpec::Kernel::first,
                   kernels::dnnl_gemm::GemmSpec::Kernel::gemm}) {
      s.kernel = k;
      ms = std::min(ms, best_ms(s, a.raw_data(), b.raw_data(), c.raw_data(), reps));
    }
    j[std::string(dtype_name(dt)) + "_tflops"] = 2.0 * n * n * n / (ms / 1e3) / 1e12;
  }
  std::printf("%s\n", j.dump().c_str());
}
