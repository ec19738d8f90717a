// What this CPU can run, and the cap a user or a test puts on it. Every run-time choice of an
// instruction set goes through max_isa(): the kernels' dispatch (Highway), AMX tiles, oneDNN's
// own ISA (capped to match in dnnl_gemm.cpp), and which bf16 matmul route the model takes.
//
// MEMFIT_MAX_ISA=scalar|avx2|avx512|avx512_bf16|amx makes a machine run as a lesser one: CI
// runs the kernel, model and train tests a second time under MEMFIT_MAX_ISA=avx2 on an
// AVX-512/AMX machine, so that a change which breaks an AVX2-only CPU fails there too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace memfit::cpu {

// Ordered: each level includes the ones below it.
enum class Isa : uint8_t {
  scalar,       // no vector extension memfit uses
  avx2,         // AVX2 + FMA + F16C (Haswell, Zen 1-3)
  avx512,       // AVX-512 F/BW/DQ/VL (Skylake-X)
  avx512_bf16,  // + AVX512_BF16 dot products (Cooper Lake, Zen 4/5)
  amx,          // + AMX tiles with bf16 (Sapphire Rapids)
};

std::string_view isa_name(Isa isa);
// ConfigError naming `source` (e.g. "MEMFIT_MAX_ISA") unless `name` is one of isa_name's.
Isa isa_from_name(std::string_view name, std::string_view source);

// What the CPU and the operating system support (CPUID and XGETBV), ignoring any cap.
Isa detected_isa();
// detected_isa() capped by MEMFIT_MAX_ISA (read once; a bad value is a ConfigError).
Isa max_isa();
// Whether `isa` may be used: max_isa() >= isa.
bool has(Isa isa);
// Whether MEMFIT_MAX_ISA lowered the level below what the CPU has.
bool capped();

// "AMD EPYC 9R14" or "Intel(R) Xeon(R) Platinum 8488C": /proc/cpuinfo's model name, else the
// CPUID brand string; for tables.
std::string model_name();
// model_name() with /proc/cpuinfo's family and model numbers, e.g. "AMD EPYC (family 26, model
// 2)": what a measurement of this CPU is keyed by (plan/calibration.h), since some virtual
// machines give one model name to several generations. model_name() alone where the numbers are
// not listed.
std::string identity();

}  // namespace memfit::cpu
