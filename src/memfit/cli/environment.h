// memfit's environment variables, checked once at start: a misspelt value stops the command
// with a ConfigError that names the variable (exit 2) before it reads, computes or writes
// anything, not at the first GEMM or the first offloaded write, minutes into a run.
#pragma once

namespace memfit::cli {

// MEMFIT_MAX_ISA, MEMFIT_GEMM_KERNEL and MEMFIT_OFFLOAD_IO, each by the parser that reads it
// where it acts (cpu.h, dnnl_gemm.h, io_engine.h).
void check_environment();

}  // namespace memfit::cli
