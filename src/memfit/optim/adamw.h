// AdamW with FP32 moments, as torch.optim.AdamW; decay only on ParamInfo::decay tensors. With
// OptimConfig::state_dtype bf16 the moments are stored in bf16 (Note [bf16 optimizer state]).
// f32 parameters are updated exactly; bf16 ones (pure bf16 training, no master weights) with
// stochastic rounding seeded by OptimConfig::seed and each element's offset in the slab
// (kernels/cpu/adamw.h), so any range of the layout rounds each element as the whole does.
#pragma once

#include "memfit/kernels/cpu/adamw.h"
#include "memfit/optim/optimizer.h"

namespace memfit {

class AdamW : public Optimizer {
 public:
  // State "m" and "v": f32 (or bf16, config.state_dtype), one per element of the layout
  // (padding included).
  AdamW(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
        std::optional<ElementRange> range = std::nullopt);
  AdamW(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
      : AdamW(config, layout, &pool) {}
  std::string name() const override { return "adamw"; }
  bool updates_bf16_weights() const override { return true; }
  // Bytes AdamW allocates for a whole layout, without allocating: 2 slabs of `state` (f32 or
  // bf16).
  static size_t state_bytes_for(const ParamLayout& layout, DType state = DType::f32);

 protected:
  std::vector<StateSpec> whole_state() const override;
  int64_t state_position(size_t, int64_t x) const override { return x; }
  void update(const Piece& piece, Tensor& w, const Tensor& g, float lr,
              float grad_scale) override;
  // kernels::adamw_update_master: the update and the rounding into `working` in one pass.
  void update_master(const Piece& piece, Tensor& w, Tensor& working, const Tensor& g, float lr,
                     float grad_scale) override;

 private:
  kernels::AdamWHyper hyper(const ParamInfo& p, float lr) const;  // decay on decay tensors only
};

}  // namespace memfit
