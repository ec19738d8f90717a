// Plain SGD over the parameter layout, one kernel call per parameter.
#include "memfit/optim/sgd.h"

#include "memfit/kernels/cpu/sgd.h"
#include "memfit/optim/step_checks.h"

namespace memfit {

Sgd::Sgd(const OptimConfig& config, const ParamLayout& layout, MemoryPool&)
    : config_(checked_optim_config(config, "sgd")), layout_(layout) {}

void Sgd::step(Tensor& params, const Tensor& grads, float lr, float grad_scale) {
  check_step_args("sgd", layout_, params, grads, lr, grad_scale);
  ++t_;
  for (const ParamInfo& p : layout_.params()) {
    Tensor pv = params.view(p.offset, {p.numel});
    kernels::sgd_update(pv, grads.view(p.offset, {p.numel}), lr,
                        p.decay ? config_.weight_decay : 0.0f, grad_scale);
  }
}

}  // namespace memfit
