// The start-up lines of memfit train and memfit plan about the machine and precision: the CPU,
// the ISA level (under MEMFIT_MAX_ISA), the kernels' SIMD target and oneDNN's ISA; what
// --precision auto chose and why; and, where bf16 has no native matmul on this CPU, that its
// matmuls are widened through the f32 GEMM (kernels/cpu/matmul_widened.h); that fp16 takes
// plain attention by default. Said once, on stderr, before anything runs.
#pragma once

#include <string>

#include "memfit/cli/options/train_config.h"

namespace memfit::cli {

void print_precision_route(Precision precision, const std::string& auto_note);
// --precision fp16 runs plain attention (flash attention has fp32 and bf16 kernels, no fp16):
// where --attention was not given (command line or --config), `config` takes plain and the
// returned line says so, to print at start; empty otherwise. An explicit --attention flash
// with fp16 is left to the run's check, which refuses it naming both options.
std::string fp16_attention_default(TrainConfig& config, bool attention_given);
// "AMD EPYC 9R14: avx512_bf16; kernels AVX3_DL, oneDNN avx512_core_bf16".
std::string machine_line();

}  // namespace memfit::cli
