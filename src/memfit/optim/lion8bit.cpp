// 8-bit Lion over pieces of the parameter layout: quantised tensors through the block kernel,
// small ones through FP32 Lion.
#include "memfit/optim/lion8bit.h"

#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/kernels/cpu/lion.h"

namespace memfit {

using Part = QuantizedStateLayout::Part;

Lion8bit::Lion8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
                   std::optional<ElementRange> range)
    : Optimizer(checked_optim_config(config, "lion8bit"), layout, range), state_layout_(layout) {
  m_ = state_layout_.append_specs("m", specs_, parts_);
  init_state(pool, "lion8bit");
}

void Lion8bit::update(const Piece& pc, Tensor& w, const Tensor& g, float lr, float grad_scale) {
  const kernels::LionHyper h{lr, config_.beta1, config_.beta2,
                             pc.param.decay ? config_.weight_decay : 0.0f};
  const int64_t n = pc.numel();
  auto part = [&](int index, Part p, int64_t count) {
    return state_view(static_cast<size_t>(index), state_layout_.position(p, pc.begin), count);
  };
  if (state_layout_.slot(pc.index).quantized) {
    Tensor mq = part(m_.codes, Part::codes, n);
    Tensor ma = part(m_.absmax, Part::absmax, kernels::quant_blocks(n));
    kernels::lion8bit_update(w, g, mq, ma, h, grad_scale);
  } else {
    Tensor m = part(m_.f32, Part::f32, n);
    kernels::lion_update(w, g, m, h, grad_scale);
  }
}

size_t Lion8bit::state_bytes_for(const ParamLayout& layout) {
  return QuantizedStateLayout(layout).bytes();
}

}  // namespace memfit
