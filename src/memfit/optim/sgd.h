// Plain SGD without momentum: no state at all, the floor for memory comparisons.
// p = p - lr (g + wd p) on ParamInfo::decay tensors, p - lr g on the rest; OptimConfig::beta1,
// beta2 and eps are ignored (see kernels/cpu/sgd.h for why decay is written this way).
#pragma once

#include "memfit/optim/optimizer.h"

namespace memfit {

class Sgd : public Optimizer {
 public:
  Sgd(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool);
  void step(Tensor& params, const Tensor& grads, float lr, float grad_scale) override;
  std::string name() const override { return "sgd"; }
  std::vector<std::pair<std::string, Tensor>> state() override { return {}; }
  size_t state_bytes() const override { return 0; }
  static size_t state_bytes_for(const ParamLayout&) { return 0; }

 private:
  OptimConfig config_;
  const ParamLayout& layout_;
};

}  // namespace memfit
