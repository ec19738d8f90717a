// Zeroing large tensors with the whole team. One thread's memset reaches a fraction of the
// memory bandwidth of a many-core machine, and a step zeroes its whole f32 gradient slab (496
// MB at gpt2): on the 16-core Xeon a step spent about 30 ms outside its kernels, most of it
// there (docs/benchmarks.md, "Where the 16-core step's time goes").
#pragma once

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// Every byte of t set to 0 (all-zero bits: +0.0 in every floating type), split over the team in
// contiguous ranges above kParallelGrain floats' worth of bytes.
void zero(Tensor& t);

}  // namespace memfit::kernels
