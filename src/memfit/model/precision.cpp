#include "memfit/model/precision.h"

#include "memfit/core/cpu.h"
#include "memfit/core/error.h"

namespace memfit {

Precision precision_from_name(std::string_view name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "fp16") return Precision::fp16;
  if (name == "fp8") return Precision::fp8;
  if (name == "auto") return auto_precision();
  MEMFIT_THROW(ConfigError, "config", "--precision must be fp32, bf16, fp16, fp8 or auto, got '{}'",
               name);
}

Precision auto_precision(std::string* why) {
  const bool native = cpu::has(cpu::Isa::avx512_bf16);
  if (why) {
    *why = native ? fmt::format("bf16: this CPU multiplies bf16 natively ({})",
                                cpu::isa_name(cpu::max_isa()))
                  : fmt::format("fp32: this CPU has no native bf16 matmul (it runs {}{}), so "
                                "bf16 would save memory but not time; ask for --precision bf16 "
                                "to have the memory",
                                cpu::isa_name(cpu::max_isa()),
                                cpu::capped() ? ", capped by MEMFIT_MAX_ISA" : "");
  }
  return native ? Precision::bf16 : Precision::fp32;
}

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}

void check_precision_options(const PrecisionOptions& o) {
  if (!o.master_weights && o.precision == Precision::fp8)
    MEMFIT_THROW(ConfigError, "config",
                 "--master-weights none with --precision fp8 is not built (Note [FP8]): fp8 "
                 "keeps FP32 master weights; use --precision bf16 for pure bf16 training");
  if (!o.master_weights && o.precision != Precision::bf16)
    MEMFIT_THROW(ConfigError, "config",
                 "--master-weights none is pure bf16 training and needs --precision bf16, got {}",
                 precision_name(o.precision));
}

DType half_dtype(Precision p) {
  switch (p) {
    case Precision::bf16:
    case Precision::fp8: return DType::bf16;
    case Precision::fp16: return DType::f16;
    default: return DType::f32;
  }
}

}  // namespace memfit
