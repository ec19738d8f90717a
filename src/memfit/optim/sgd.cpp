// Plain SGD: one kernel call per piece of a parameter.
#include "memfit/optim/sgd.h"

#include "memfit/kernels/cpu/sgd.h"

namespace memfit {

Sgd::Sgd(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
         std::optional<ElementRange> range)
    : Optimizer(checked_optim_config(config, "sgd"), layout, range) {
  init_state(pool, "sgd");
}

void Sgd::update(const Piece& pc, Tensor& w, const Tensor& g, float lr, float grad_scale) {
  kernels::sgd_update(w, g, lr, pc.param.decay ? config_.weight_decay : 0.0f, grad_scale);
}

}  // namespace memfit
