// Plain SGD without momentum: no state at all, the floor for memory comparisons.
// p = p - lr (g + wd p) on ParamInfo::decay tensors, p - lr g on the rest; OptimConfig::beta1,
// beta2 and eps are ignored (see kernels/cpu/sgd.h for why decay is written this way).
#pragma once

#include "memfit/optim/optimizer.h"

namespace memfit {

class Sgd : public Optimizer {
 public:
  Sgd(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
      std::optional<ElementRange> range = std::nullopt);
  Sgd(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
      : Sgd(config, layout, &pool) {}
  std::string name() const override { return "sgd"; }
  static size_t state_bytes_for(const ParamLayout&) { return 0; }

 protected:
  std::vector<StateSpec> whole_state() const override { return {}; }
  int64_t state_position(size_t, int64_t) const override { return 0; }
  void update(const Piece& piece, Tensor& w, const Tensor& g, float lr,
              float grad_scale) override;
};

}  // namespace memfit
