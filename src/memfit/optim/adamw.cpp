#include "memfit/optim/adamw.h"

#include "memfit/kernels/cpu/adamw.h"

namespace memfit {

AdamW::AdamW(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
    : config_(config), layout_(layout) {
  m_ = Tensor::empty(pool, {layout.total()}, DType::f32, Category::optimizer, "adamw.m");
  v_ = Tensor::empty(pool, {layout.total()}, DType::f32, Category::optimizer, "adamw.v");
}

void AdamW::step(Tensor& params, const Tensor& grads, float lr, float grad_scale) {
  ++t_;
  for (const ParamInfo& p : layout_.params()) {
    const kernels::AdamWHyper h = hyper(p, lr);
    Tensor pv = params.view(p.offset, {p.numel});
    Tensor mv = m_.view(p.offset, {p.numel}), vv = v_.view(p.offset, {p.numel});
    Tensor gv = grads.view(p.offset, {p.numel});
    if (params.dtype() == DType::bf16)  // pure bf16: no master copy to round from
      kernels::adamw_update_stochastic(pv, gv, mv, vv, h, t_, grad_scale, config_.seed,
                                       static_cast<uint64_t>(p.offset));
    else
      kernels::adamw_update(pv, gv, mv, vv, h, t_, grad_scale);
  }
}

void AdamW::step_master(Tensor& master, Tensor& working, const Tensor& grads, float lr,
                        float grad_scale) {
  ++t_;
  for (const ParamInfo& p : layout_.params()) {
    Tensor pv = master.view(p.offset, {p.numel}), wv = working.view(p.offset, {p.numel});
    Tensor mv = m_.view(p.offset, {p.numel}), vv = v_.view(p.offset, {p.numel});
    kernels::adamw_update_master(pv, wv, grads.view(p.offset, {p.numel}), mv, vv, hyper(p, lr),
                                 t_, grad_scale);
  }
}

kernels::AdamWHyper AdamW::hyper(const ParamInfo& p, float lr) const {
  return {lr, config_.beta1, config_.beta2, config_.eps, p.decay ? config_.weight_decay : 0.0f};
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() { return {{"m", m_}, {"v", v_}}; }

size_t AdamW::state_bytes() const { return m_.nbytes() + v_.nbytes(); }

size_t AdamW::state_bytes_for(const ParamLayout& layout) {
  return 2 * MemoryPool::round_up(static_cast<size_t>(layout.total()) * sizeof(float));
}

}  // namespace memfit
