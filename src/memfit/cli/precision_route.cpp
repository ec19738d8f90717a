#include "memfit/cli/precision_route.h"

#include <fmt/format.h>

#include "memfit/core/cpu.h"
#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::cli {

std::string machine_line() {
  return fmt::format("{}: {}{}; kernels {}, oneDNN {}", cpu::model_name(),
                     cpu::isa_name(cpu::max_isa()), cpu::capped() ? " (MEMFIT_MAX_ISA)" : "",
                     kernels::simd_target(), kernels::dnnl_gemm::isa());
}

std::string fp16_attention_default(TrainConfig& config, bool attention_given) {
  if (attention_given || config.precision != "fp16" || config.attention == "plain") return "";
  config.attention = "plain";
  return "--precision fp16: --attention plain (flash attention runs in fp32 and bf16 only; "
         "plain is fp16's default)";
}

void print_precision_route(Precision precision, const std::string& auto_note) {
  fmt::print(stderr, "memfit: {}\n", machine_line());
  if (!auto_note.empty()) fmt::print(stderr, "memfit: {}\n", auto_note);
  if (precision == Precision::fp8)
    fmt::print(stderr,
               "memfit: --precision fp8: the blocks' linears compute on FP8 operands (weights and "
               "inputs E4M3, output gradients E5M2, current power-of-two scales per tensor), "
               "widened exactly to {} for the GEMM: the numerics are FP8's and the speed is "
               "bf16's (no x86 CPU multiplies FP8); the blocks' linear weights are stored in "
               "E4M3, one byte each, where they and the master weights are in RAM (ZeRO stages "
               "0-2, no offload; under --tp and --pp too; bf16 otherwise); the embeddings, norms "
               "and LM head are bf16 (Note [FP8], docs/notes/fp8.md)\n",
               kernels::matmul_widens(DType::bf16) ? "bf16 and on to f32" : "bf16");
  if ((precision == Precision::bf16 || precision == Precision::fp8) &&
      kernels::matmul_widens(DType::bf16))
    fmt::print(stderr,
               "memfit: bf16 matmuls are widened to f32 and run on the f32 GEMM: oneDNN has no "
               "native bf16 matmul on this CPU (ISA {}; it needs AVX512_BF16 or AMX); bf16 keeps "
               "its memory saving, not its speed\n",
               kernels::dnnl_gemm::isa());
}

}  // namespace memfit::cli
