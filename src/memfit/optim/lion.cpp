// FP32 Lion: one kernel call per piece of a parameter.
#include "memfit/optim/lion.h"

#include "memfit/kernels/cpu/lion.h"

namespace memfit {

Lion::Lion(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
           std::optional<ElementRange> range)
    : Optimizer(checked_optim_config(config, "lion"), layout, range) {
  init_state(pool, "lion");
}

std::vector<StateSpec> Lion::whole_state() const { return {{"m", DType::f32, layout_.total()}}; }

void Lion::update(const Piece& pc, Tensor& w, const Tensor& g, float lr, float grad_scale) {
  kernels::LionHyper h{lr, config_.beta1, config_.beta2,
                       pc.param.decay ? config_.weight_decay : 0.0f};
  Tensor m = state_view(0, pc.begin, pc.numel());
  kernels::lion_update(w, g, m, h, grad_scale);
}

size_t Lion::state_bytes_for(const ParamLayout& layout) {
  return MemoryPool::round_up(static_cast<size_t>(layout.total()) * sizeof(float));
}

}  // namespace memfit
