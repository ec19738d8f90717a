// Lion (Chen et al. 2023) with an FP32 momentum: 4 bytes of state per parameter, half AdamW's.
// Decoupled decay only on ParamInfo::decay tensors. OptimConfig::beta1 interpolates the update's
// sign and beta2 decays the momentum; the paper suggests (0.9, 0.99), a learning rate 3-10x
// below AdamW's and a weight decay 3-10x above.
#pragma once

#include "memfit/optim/optimizer.h"

namespace memfit {

class Lion : public Optimizer {
 public:
  // State "m": f32, one per element of the layout.
  Lion(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
       std::optional<ElementRange> range = std::nullopt);
  Lion(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
      : Lion(config, layout, &pool) {}
  std::string name() const override { return "lion"; }
  static size_t state_bytes_for(const ParamLayout& layout);

 protected:
  std::vector<StateSpec> whole_state() const override;
  int64_t state_position(size_t, int64_t x) const override { return x; }
  void update(const Piece& piece, Tensor& w, const Tensor& g, float lr,
              float grad_scale) override;
};

}  // namespace memfit
