// AdamW with 8-bit block-wise moments (bitsandbytes' 8-bit AdamW): about 2 bytes of state per
// parameter plus 8 bytes per 256-value block, against AdamW's 8. Tensors under 4096 values keep
// FP32 moments. Decay only on ParamInfo::decay tensors. See Note [8-bit optimizers].
#pragma once

#include "memfit/optim/optimizer.h"
#include "memfit/optim/quantized_state.h"

namespace memfit {

class AdamW8bit : public Optimizer {
 public:
  // State m.codes, m.absmax, m.f32, v.codes, v.absmax, v.f32; empty parts are absent.
  AdamW8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
            std::optional<ElementRange> range = std::nullopt);
  AdamW8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
      : AdamW8bit(config, layout, &pool) {}
  std::string name() const override { return "adamw8bit"; }
  // Pure bf16: the block is widened, updated and stored with stochastic rounding (as AdamW).
  bool updates_bf16_weights() const override { return true; }
  int64_t next_cut(int64_t x) const override { return state_layout_.next_cut(x); }
  static size_t state_bytes_for(const ParamLayout& layout);

 protected:
  std::vector<StateSpec> whole_state() const override { return specs_; }
  int64_t state_position(size_t i, int64_t x) const override {
    return state_layout_.position(parts_[i], x);
  }
  void update(const Piece& piece, Tensor& w, const Tensor& g, float lr,
              float grad_scale) override;

 private:
  QuantizedStateLayout state_layout_;
  std::vector<StateSpec> specs_;
  std::vector<QuantizedStateLayout::Part> parts_;
  QuantizedStateLayout::Moment m_, v_;
};

}  // namespace memfit
