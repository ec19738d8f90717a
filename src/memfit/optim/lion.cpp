// FP32 Lion over the parameter layout, one kernel call per parameter.
#include "memfit/optim/lion.h"

#include "memfit/kernels/cpu/lion.h"
#include "memfit/optim/step_checks.h"

namespace memfit {

Lion::Lion(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
    : config_(checked_optim_config(config, "lion")), layout_(layout) {
  m_ = Tensor::empty(pool, {layout.total()}, DType::f32, Category::optimizer, "lion.m");
}

void Lion::step(Tensor& params, const Tensor& grads, float lr, float grad_scale) {
  check_step_args("lion", layout_, params, grads, lr, grad_scale);
  ++t_;
  for (const ParamInfo& p : layout_.params()) {
    kernels::LionHyper h{lr, config_.beta1, config_.beta2, p.decay ? config_.weight_decay : 0.0f};
    Tensor pv = params.view(p.offset, {p.numel});
    Tensor mv = m_.view(p.offset, {p.numel});
    kernels::lion_update(pv, grads.view(p.offset, {p.numel}), mv, h, grad_scale);
  }
}

std::vector<std::pair<std::string, Tensor>> Lion::state() { return {{"m", m_}}; }

size_t Lion::state_bytes() const { return m_.nbytes(); }

size_t Lion::state_bytes_for(const ParamLayout& layout) {
  return MemoryPool::round_up(static_cast<size_t>(layout.total()) * sizeof(float));
}

}  // namespace memfit
