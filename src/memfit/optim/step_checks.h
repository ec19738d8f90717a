// The argument checks every Optimizer::step makes before touching memory: slabs of the layout's
// size and type, and a usable learning rate and gradient scale.
#pragma once

#include <string_view>

#include "memfit/core/tensor.h"
#include "memfit/model/param_layout.h"

namespace memfit {

// Throws ShapeError / DTypeError for slabs that do not match `layout`, Error for a negative or
// non-finite lr or a non-finite grad_scale; `op` is the optimizer's name.
void check_step_args(std::string_view op, const ParamLayout& layout, const Tensor& params,
                     const Tensor& grads, float lr, float grad_scale);

}  // namespace memfit
