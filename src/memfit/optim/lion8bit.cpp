// 8-bit Lion over the parameter layout: quantised tensors through the block kernel, small ones
// through FP32 Lion.
#include "memfit/optim/lion8bit.h"

#include "memfit/kernels/cpu/lion.h"
#include "memfit/optim/step_checks.h"

namespace memfit {

Lion8bit::Lion8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
    : config_(checked_optim_config(config, "lion8bit")),
      layout_(layout),
      state_layout_(layout),
      m_(state_layout_, pool, "lion8bit.m") {}

void Lion8bit::step(Tensor& params, const Tensor& grads, float lr, float grad_scale) {
  check_step_args("lion8bit", layout_, params, grads, lr, grad_scale);
  ++t_;
  const auto& infos = layout_.params();
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    const QuantizedStateLayout::Slot& s = state_layout_.slot(i);
    kernels::LionHyper h{lr, config_.beta1, config_.beta2, p.decay ? config_.weight_decay : 0.0f};
    Tensor pv = params.view(p.offset, {p.numel});
    Tensor gv = grads.view(p.offset, {p.numel});
    if (s.quantized) {
      Tensor mq = m_.codes_for(p, s), ma = m_.absmax_for(p, s);
      kernels::lion8bit_update(pv, gv, mq, ma, h, grad_scale);
    } else {
      Tensor mv = m_.f32_for(p, s);
      kernels::lion_update(pv, gv, mv, h, grad_scale);
    }
  }
}

std::vector<std::pair<std::string, Tensor>> Lion8bit::state() {
  std::vector<std::pair<std::string, Tensor>> out;
  m_.append_state("m", out);
  return out;
}

size_t Lion8bit::state_bytes() const { return m_.bytes(); }

size_t Lion8bit::state_bytes_for(const ParamLayout& layout) {
  return QuantizedStateLayout(layout).bytes();
}

}  // namespace memfit
