// Lion with its one momentum as 8-bit block-wise state on the signed dynamic map: about 1 byte
// of state per parameter plus 4 bytes per 256-value block. Tensors under 4096 values keep an
// FP32 momentum. See Note [8-bit optimizers].
#pragma once

#include "memfit/optim/optimizer.h"
#include "memfit/optim/quantized_state.h"

namespace memfit {

class Lion8bit : public Optimizer {
 public:
  // State m.codes (i8), m.absmax (f32), m.f32 (small tensors); empty parts are absent.
  Lion8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
           std::optional<ElementRange> range = std::nullopt);
  Lion8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
      : Lion8bit(config, layout, &pool) {}
  std::string name() const override { return "lion8bit"; }
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
  QuantizedStateLayout::Moment m_;
};

}  // namespace memfit
