// 8-bit AdamW over the parameter layout: quantised tensors through the block kernel, small ones
// through the same arithmetic on FP32 state.
#include "memfit/optim/adamw8bit.h"

#include "memfit/kernels/cpu/adamw8bit.h"
#include "memfit/optim/step_checks.h"

namespace memfit {

AdamW8bit::AdamW8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
    : config_(checked_optim_config(config, "adamw8bit")),
      layout_(layout),
      state_layout_(layout),
      m_(state_layout_, pool, "adamw8bit.m"),
      v_(state_layout_, pool, "adamw8bit.v") {}

void AdamW8bit::step(Tensor& params, const Tensor& grads, float lr, float grad_scale) {
  check_step_args("adamw8bit", layout_, params, grads, lr, grad_scale);
  ++t_;
  const auto& infos = layout_.params();
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    const QuantizedStateLayout::Slot& s = state_layout_.slot(i);
    kernels::AdamWHyper h{lr, config_.beta1, config_.beta2, config_.eps,
                          p.decay ? config_.weight_decay : 0.0f};
    Tensor pv = params.view(p.offset, {p.numel});
    Tensor gv = grads.view(p.offset, {p.numel});
    if (s.quantized) {
      Tensor mq = m_.codes_for(p, s), ma = m_.absmax_for(p, s);
      Tensor vq = v_.codes_for(p, s), va = v_.absmax_for(p, s);
      kernels::adamw8bit_update(pv, gv, mq, ma, vq, va, h, t_, grad_scale);
    } else {
      Tensor mv = m_.f32_for(p, s), vv = v_.f32_for(p, s);
      kernels::adamw8bit_update_f32(pv, gv, mv, vv, h, t_, grad_scale);
    }
  }
}

std::vector<std::pair<std::string, Tensor>> AdamW8bit::state() {
  std::vector<std::pair<std::string, Tensor>> out;
  m_.append_state("m", out);
  v_.append_state("v", out);
  return out;
}

size_t AdamW8bit::state_bytes() const { return m_.bytes() + v_.bytes(); }

size_t AdamW8bit::state_bytes_for(const ParamLayout& layout) {
  return 2 * QuantizedStateLayout(layout).bytes();
}

}  // namespace memfit
