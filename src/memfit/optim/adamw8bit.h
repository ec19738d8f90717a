// AdamW with 8-bit block-wise moments (bitsandbytes' 8-bit AdamW): about 2 bytes of state per
// parameter plus 8 bytes per 256-value block, against AdamW's 8. Tensors under 4096 values keep
// FP32 moments. Decay only on ParamInfo::decay tensors. See Note [8-bit optimizers].
#pragma once

#include "memfit/optim/optimizer.h"
#include "memfit/optim/quantized_state.h"

namespace memfit {

class AdamW8bit : public Optimizer {
 public:
  AdamW8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool);
  void step(Tensor& params, const Tensor& grads, float lr, float grad_scale) override;
  std::string name() const override { return "adamw8bit"; }
  // m.codes (i8, signed map), m.absmax (f32), m.f32 (small tensors); the same for v (unsigned
  // map). Parts with nothing in them are absent.
  std::vector<std::pair<std::string, Tensor>> state() override;
  size_t state_bytes() const override;
  // Bytes the constructor allocates for a layout, without allocating.
  static size_t state_bytes_for(const ParamLayout& layout);

 private:
  OptimConfig config_;
  const ParamLayout& layout_;
  QuantizedStateLayout state_layout_;
  QuantizedState m_, v_;
};

}  // namespace memfit
