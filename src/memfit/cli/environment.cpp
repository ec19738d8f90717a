#include "memfit/cli/environment.h"

#include <cstdlib>

#include "memfit/core/cpu.h"
#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/offload/io_engine.h"

namespace memfit::cli {

void check_environment() {
  cpu::max_isa();
  kernels::dnnl_gemm::kernel_rule_from_env(std::getenv("MEMFIT_GEMM_KERNEL"));
  offload::io_choice_from_env(std::getenv("MEMFIT_OFFLOAD_IO"));
}

}  // namespace memfit::cli
