// 8-bit AdamW over pieces of the parameter layout: quantised tensors through the block kernel,
// small ones through the same arithmetic on FP32 state.
#include "memfit/optim/adamw8bit.h"

#include "memfit/kernels/cpu/adamw8bit.h"
#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/model/stage_offsets.h"

namespace memfit {

using Part = QuantizedStateLayout::Part;

AdamW8bit::AdamW8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
                     std::optional<ElementRange> range)
    : Optimizer(checked_optim_config(config, "adamw8bit"), layout, range), state_layout_(layout) {
  m_ = state_layout_.append_specs("m", specs_, parts_);
  v_ = state_layout_.append_specs("v", specs_, parts_);
  init_state(pool, "adamw8bit");
}

void AdamW8bit::update(const Piece& pc, Tensor& w, const Tensor& g, float lr, float grad_scale) {
  const kernels::AdamWHyper h{lr, config_.beta1, config_.beta2, config_.eps,
                              pc.param.decay ? config_.weight_decay : 0.0f};
  const int64_t n = pc.numel();
  auto part = [&](int index, Part p, int64_t count) {
    return state_view(static_cast<size_t>(index), state_layout_.position(p, pc.begin), count);
  };
  if (state_layout_.slot(pc.index).quantized) {
    const int64_t blocks = kernels::quant_blocks(n);
    Tensor mq = part(m_.codes, Part::codes, n), ma = part(m_.absmax, Part::absmax, blocks);
    Tensor vq = part(v_.codes, Part::codes, n), va = part(v_.absmax, Part::absmax, blocks);
    if (w.dtype() == DType::bf16)  // pure bf16: no master copy to round from
      kernels::adamw8bit_update_stochastic(w, g, mq, ma, vq, va, h, t_, grad_scale, config_.seed,
                                           static_cast<uint64_t>(whole_index(layout_, pc.begin)));
    else
      kernels::adamw8bit_update(w, g, mq, ma, vq, va, h, t_, grad_scale);
  } else {
    Tensor m = part(m_.f32, Part::f32, n), v = part(v_.f32, Part::f32, n);
    if (w.dtype() == DType::bf16)
      kernels::adamw8bit_update_f32_stochastic(w, g, m, v, h, t_, grad_scale, config_.seed,
                                               static_cast<uint64_t>(whole_index(layout_, pc.begin)));
    else
      kernels::adamw8bit_update_f32(w, g, m, v, h, t_, grad_scale);
  }
}

size_t AdamW8bit::state_bytes_for(const ParamLayout& layout) {
  return 2 * QuantizedStateLayout(layout).bytes();
}

}  // namespace memfit
