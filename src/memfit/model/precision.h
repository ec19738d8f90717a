// Training precision: which element type the working weights and the saved activations have,
// and whether FP32 master weights stand behind them. The table of which tensor is in which
// type, and why, is in docs/notes/mixed-precision.md.
#pragma once

#include <cstdint>
#include <string_view>

#include "memfit/core/dtype.h"

namespace memfit {

enum class Precision : uint8_t {
  fp32,  // everything f32: the reference
  bf16,  // bf16 matmul operands and saved activations (AMX), f32 residual stream and statistics
  fp16,  // as bf16 in IEEE half, with dynamic loss scaling
  // bf16's storage and kernels, with the blocks' linears on FP8 operands: weights and inputs
  // cast to E4M3, output gradients to E5M2, each with its own current power-of-two scale
  // (Note [FP8], docs/notes/fp8.md). FP8's numerics at bf16's speed: no x86 CPU multiplies FP8.
  fp8,
};

// "fp32", "bf16", "fp16", "fp8", or "auto" (auto_precision(), never fp8); ConfigError for
// anything else.
Precision precision_from_name(std::string_view name);
std::string_view precision_name(Precision p);

// --precision auto: bf16 where the CPU multiplies bf16 natively (AVX512_BF16 dot products or
// AMX tiles, under MEMFIT_MAX_ISA), else fp32: without them bf16's matmuls are widened through
// the f32 GEMM, so bf16 saves memory but not time. `why` gets the reason, for the start-up line.
Precision auto_precision(std::string* why = nullptr);

// The type of matmul operands and saved activations: f32, bf16 (bf16 and fp8) or f16.
DType half_dtype(Precision p);

struct PrecisionOptions {
  Precision precision = Precision::fp32;
  // With bf16/fp16: keep FP32 master weights (Category::master) that the optimizer updates and
  // the working copy is rounded from. false (--master-weights none) is pure bf16: the bf16
  // weights are updated directly with stochastic rounding.
  bool master_weights = true;
};

// ConfigError unless the options make sense: no master weights means pure bf16, so it needs
// bf16 (fp8 without master weights is not built: its message says so).
void check_precision_options(const PrecisionOptions& options);

}  // namespace memfit
