// The start-up line of memfit train and memfit plan about precision: what --precision auto chose
// and why, and, where bf16 has no native matmul on this CPU, that its matmuls are widened through
// the f32 GEMM (kernels/cpu/matmul_widened.h). Said once, on stderr, before anything runs.
#pragma once

#include <string>

#include "memfit/train/train_config.h"

namespace memfit::cli {

void print_precision_route(const TrainConfig& config, const std::string& auto_note);

}  // namespace memfit::cli
