// Lion with its one momentum as 8-bit block-wise state on the signed dynamic map: about 1 byte
// of state per parameter plus 4 bytes per 256-value block. Tensors under 4096 values keep an
// FP32 momentum. See Note [8-bit optimizers].
#pragma once

#include "memfit/optim/optimizer.h"
#include "memfit/optim/quantized_state.h"

namespace memfit {

class Lion8bit : public Optimizer {
 public:
  Lion8bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool);
  void step(Tensor& params, const Tensor& grads, float lr, float grad_scale) override;
  std::string name() const override { return "lion8bit"; }
  // m.codes (i8), m.absmax (f32), m.f32 (small tensors); empty parts are absent.
  std::vector<std::pair<std::string, Tensor>> state() override;
  size_t state_bytes() const override;
  static size_t state_bytes_for(const ParamLayout& layout);

 private:
  OptimConfig config_;
  const ParamLayout& layout_;
  QuantizedStateLayout state_layout_;
  QuantizedState m_;
};

}  // namespace memfit
