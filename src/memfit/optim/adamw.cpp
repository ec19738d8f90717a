#include "memfit/optim/adamw.h"

#include "memfit/kernels/cpu/adamw.h"
#include "memfit/model/stage_offsets.h"

namespace memfit {

AdamW::AdamW(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
             std::optional<ElementRange> range)
    : Optimizer(checked_optim_config(config, "adamw"), layout, range) {
  init_state(pool, "adamw");
}

std::vector<StateSpec> AdamW::whole_state() const {
  const DType s = config_.state_dtype;
  return {{"m", s, layout_.total()}, {"v", s, layout_.total()}};
}

void AdamW::update(const Piece& pc, Tensor& w, const Tensor& g, float lr, float grad_scale) {
  Tensor m = state_view(0, pc.begin, pc.numel()), v = state_view(1, pc.begin, pc.numel());
  // Pure bf16: no master copy to round from. The rounding's random bits are drawn by the
  // element's index in the whole model, so a pipeline stage rounds as one process does (and
  // the last stage's copy of a tied table as the table: Note [Pipeline parallel]).
  if (w.dtype() == DType::bf16)
    kernels::adamw_update_stochastic(w, g, m, v, hyper(pc.param, lr), t_, grad_scale,
                                     config_.seed,
                                     static_cast<uint64_t>(whole_index(layout_, pc.begin)));
  else
    kernels::adamw_update(w, g, m, v, hyper(pc.param, lr), t_, grad_scale);
}

void AdamW::update_master(const Piece& pc, Tensor& w, Tensor& working, const Tensor& g,
                          float lr, float grad_scale) {
  Tensor m = state_view(0, pc.begin, pc.numel()), v = state_view(1, pc.begin, pc.numel());
  kernels::adamw_update_master(w, working, g, m, v, hyper(pc.param, lr), t_, grad_scale);
}

kernels::AdamWHyper AdamW::hyper(const ParamInfo& p, float lr) const {
  return {lr, config_.beta1, config_.beta2, config_.eps, p.decay ? config_.weight_decay : 0.0f};
}

size_t AdamW::state_bytes_for(const ParamLayout& layout, DType state) {
  return 2 * MemoryPool::round_up(static_cast<size_t>(layout.total()) * dtype_size(state));
}

}  // namespace memfit
