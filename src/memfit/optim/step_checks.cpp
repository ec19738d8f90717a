// Argument checks shared by the optimizers' step (see step_checks.h).
#include "memfit/optim/step_checks.h"

#include <cmath>

#include "memfit/kernels/cpu/checks.h"

namespace memfit {

void check_step_args(std::string_view op, const ParamLayout& layout, const Tensor& params,
                     const Tensor& grads, float lr, float grad_scale) {
  kernels::expect_tensor(params, op, "params", {layout.total()}, DType::f32);
  kernels::expect_tensor(grads, op, "grads", {layout.total()}, DType::f32);
  MEMFIT_CHECK(std::isfinite(lr) && lr >= 0.0f, op, "learning rate must be finite and >= 0, got {}",
               lr);
  MEMFIT_CHECK(std::isfinite(grad_scale), op, "grad_scale must be finite, got {}", grad_scale);
}

}  // namespace memfit
