#include "memfit/cli/precision_route.h"

#include <fmt/format.h>

#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/cpu/matmul_widened.h"

namespace memfit::cli {

void print_precision_route(const TrainConfig& config, const std::string& auto_note) {
  if (!auto_note.empty()) fmt::print(stderr, "memfit: {}\n", auto_note);
  if (config.precision == "bf16" && kernels::matmul_widens(DType::bf16))
    fmt::print(stderr,
               "memfit: bf16 matmuls are widened to f32 and run on the f32 GEMM: oneDNN has no "
               "bf16 matmul on this CPU (ISA {}); bf16 keeps its memory saving, not its speed\n",
               kernels::dnnl_gemm::isa());
}

}  // namespace memfit::cli
