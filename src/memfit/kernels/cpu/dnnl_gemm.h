// The one place memfit talks to oneDNN's matmul primitive (2.x API): a GEMM described by its
// sizes, strides and element types, executed through a thread-safe cache of primitives. The
// public entry points (gemm, matmul_forward/backward in matmul.h) are thin layers over it;
// lower precisions (bf16 inputs with f32 accumulation, f32 or bf16 output) go the same path.
// oneDNN 2.6 has no f16 matmul on the CPU at all (not even a reference one): f16 operands fail
// here as a oneDNN error; matmul_forward/backward reject them first with a DTypeError.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memfit/core/dtype.h"

namespace memfit::kernels::dnnl_gemm {

// C (M, N) = alpha * op(A) @ op(B) [+ bias] + beta * C, all row-major. A is stored (M, K), or
// (K, M) if trans_a, with row stride lda; B is stored (K, N), or (N, K) if trans_b, with row
// stride ldb; C has row stride ldc. beta = 0 does not read C. Every field is part of the
// primitive cache key.
struct GemmSpec {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;  // add a (N) row vector to every row
  DType a_type = DType::f32, b_type = DType::f32, c_type = DType::f32, bias_type = DType::f32;
  // Which of oneDNN's kernels runs it. automatic: memfit's rule (Note [GEMM kernel] in
  // dnnl_gemm.cpp: oneDNN's GEMM-based kernel, "gemm:jit", for f32, and for bf16 weight
  // gradients (trans_a) unless oneDNN's first choice is AMX; its first choice otherwise);
  // first: oneDNN's first choice (brgemm on AVX-512); gemm: its GEMM-based kernel where it has
  // one. The last two are for benchmarks.
  enum class Kernel : uint8_t { automatic, first, gemm };
  Kernel kernel = Kernel::automatic;

  bool operator==(const GemmSpec&) const = default;
};

// Runs the GEMM. Sizes and strides must already be valid (callers check and name their op);
// a oneDNN failure becomes a memfit::Error that quotes the failing call.
void execute(const GemmSpec& spec, const void* A, const void* B, void* C,
             const void* bias = nullptr);

// Whether oneDNN multiplies bf16 natively on this CPU under the MEMFIT_MAX_ISA cap: AVX512_BF16
// or AMX (Cooper Lake, Sapphire Rapids, Zen 4 and 5). Asked once, by building a small bf16
// primitive there. Where it is false, bf16 matmuls take the widened route (matmul_widened.h):
// on AVX2-only CPUs oneDNN 2.6 has no bf16 matmul, and on plain AVX-512 (Skylake-SP, Cascade
// Lake, Ice Lake) it has one that emulates the bf16 dot product, at 0.045-0.048 TFLOP/s against
// its f32 GEMM's 0.12-0.17 on a 2-core Cascade Lake (2048^3, 2026-11-28): a bf16 step there took
// 2.8x the fp32 step's time (docs/notes/mixed-precision.md, "Matmul: bf16 on AMX, and no f16").
bool bf16_native();

// oneDNN's effective ISA, e.g. "avx2" or "avx512_core_amx", after memfit's cap is applied.
const char* isa();

// MEMFIT_GEMM_KERNEL: the rule that picks each automatic product's kernel (Note [GEMM kernel]),
// for A/B runs. Unset, empty or "auto": memfit's rule; "first": oneDNN's first choice for every
// product; "jit-weight-gradients": memfit's rule without its AMX exception (bf16 weight
// gradients in gemm:jit on AMX too, to measure it there). Anything else is a ConfigError that
// names the variable and the values it takes, as MEMFIT_MAX_ISA's is.
enum class KernelRule : uint8_t { automatic, first, jit_weight_gradients };
KernelRule kernel_rule_from_env(const char* value);

// Number of primitives in the cache, and the oneDNN implementation chosen for `spec` (e.g.
// "gemm:jit", "brg:avx512_core_amx_bf16"), for tests and benchmarks.
size_t cache_size();
const char* implementation(const GemmSpec& spec);
// The scratch bytes oneDNN asks for to run `spec` (from thread_scratch, outside the pool).
size_t scratch_bytes(const GemmSpec& spec);

}  // namespace memfit::kernels::dnnl_gemm
