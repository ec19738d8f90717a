// The check the update takes of bf16 gradient sums (--grad-dtype bf16, Note [Gradients in
// bf16]): unscaled in place where the step has a loss scale (a power of two: exact but where it
// underflows), and their squares added in double in chunks of fixed size whose partials are
// added in order, so the result does not depend on the thread count. One definition for the
// sums in RAM (train/update.cpp) and on disk (offload/offloaded_grads.cpp: each unit checked as
// its last backward ends), so both give the same bits.
#pragma once

#include <cstdint>
#include <optional>

#include "memfit/kernels/cpu/convert.h"

namespace memfit::kernels {

UnscaleResult unscale_and_check_bf16(uint16_t* x, int64_t n, std::optional<float> inv_scale);

}  // namespace memfit::kernels
