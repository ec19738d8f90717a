// Lion (Chen et al. 2023) with an FP32 momentum: 4 bytes of state per parameter, half AdamW's.
// Decoupled decay only on ParamInfo::decay tensors. OptimConfig::beta1 interpolates the update's
// sign and beta2 decays the momentum; the paper suggests (0.9, 0.99), a learning rate 3-10x
// below AdamW's and a weight decay 3-10x above.
#pragma once

#include "memfit/optim/optimizer.h"

namespace memfit {

class Lion : public Optimizer {
 public:
  Lion(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool);
  void step(Tensor& params, const Tensor& grads, float lr, float grad_scale) override;
  std::string name() const override { return "lion"; }
  std::vector<std::pair<std::string, Tensor>> state() override;  // "m" (f32, layout.total())
  size_t state_bytes() const override;
  static size_t state_bytes_for(const ParamLayout& layout);

 private:
  OptimConfig config_;
  const ParamLayout& layout_;
  Tensor m_;
};

}  // namespace memfit
