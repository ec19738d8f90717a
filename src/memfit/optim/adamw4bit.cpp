// 4-bit AdamW over pieces of the parameter layout: matrices through the rank-1 kernel, other
// quantised tensors through the block-wise one, small ones through the 8-bit AdamW's FP32 path
// (the same arithmetic).
#include "memfit/optim/adamw4bit.h"

#include <span>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/adamw4bit.h"
#include "memfit/kernels/cpu/adamw8bit.h"
#include "memfit/kernels/cpu/quant4.h"

namespace memfit {

using Part = QuantizedStateLayout::Part;

AdamW4bit::AdamW4bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
                     std::optional<ElementRange> range)
    : Optimizer(checked_optim_config(config, "adamw4bit"), layout, range),
      m_layout_(layout, first_moment_format()),
      v_layout_(layout, second_moment_format()) {
  m_ = m_layout_.append_specs("m", specs_, parts_);
  v_first_ = specs_.size();
  v_ = v_layout_.append_specs("v", specs_, parts_);
  init_state(pool, "adamw4bit");
}

void AdamW4bit::update(const Piece& pc, Tensor& w, const Tensor& g, float lr, float grad_scale) {
  const kernels::AdamWHyper h{lr, config_.beta1, config_.beta2, config_.eps,
                              pc.param.decay ? config_.weight_decay : 0.0f};
  const int64_t n = pc.numel();
  auto part = [&](int index, const QuantizedStateLayout& l, Part p, int64_t count) {
    return state_view(static_cast<size_t>(index), l.position(p, pc.begin), count);
  };
  const auto& slot = v_layout_.slot(pc.index);
  if (!slot.quantized) {
    Tensor m = part(m_.f32, m_layout_, Part::f32, n), v = part(v_.f32, v_layout_, Part::f32, n);
    kernels::adamw8bit_update_f32(w, g, m, v, h, t_, grad_scale);
    return;
  }
  const int64_t bytes = kernels::quant4_bytes(n), blocks = kernels::quant4_blocks(n);
  Tensor mq = part(m_.codes, m_layout_, Part::codes, bytes);
  Tensor ma = part(m_.absmax, m_layout_, Part::absmax, blocks);
  Tensor vq = part(v_.codes, v_layout_, Part::codes, bytes);
  if (slot.rank1) {
    const int64_t rows = pc.param.shape[0], cols = pc.param.shape[1];
    MEMFIT_CHECK(pc.begin == pc.param.offset && n == pc.param.numel, "adamw4bit",
                 "{}: a rank-1 state is updated whole, got elements [{}, {}) of [{}, {})",
                 pc.param.name, pc.begin, pc.end, pc.param.offset,
                 pc.param.offset + pc.param.numel);
    Tensor vs = part(v_.rowcol, v_layout_, Part::rowcol, rows + cols);
    const SliceAxis axis = split_.axis(pc.index);
    kernels::RowColMaxima whole_maxima;  // one process's: none
    if (axis != SliceAxis::whole)
      whole_maxima = [&](std::span<float> row_max, std::span<float> col_max) {
        // The rank's rows whole (cut by rows): its columns run through every rank's rows.
        split_.group->all_reduce_max(axis == SliceAxis::rows ? col_max : row_max);
      };
    kernels::adamw4bit_update_rank1(w, g, rows, cols, mq, ma, vq, vs, h, t_, grad_scale,
                                    whole_maxima);
  } else {
    Tensor va = part(v_.absmax, v_layout_, Part::absmax, blocks);
    kernels::adamw4bit_update(w, g, mq, ma, vq, va, h, t_, grad_scale);
  }
}

size_t AdamW4bit::state_bytes_for(const ParamLayout& layout) {
  return QuantizedStateLayout(layout, first_moment_format()).bytes() +
         QuantizedStateLayout(layout, second_moment_format()).bytes();
}

}  // namespace memfit
