// AdamW with FP32 moments, as torch.optim.AdamW; decay only on ParamInfo::decay tensors.
// f32 parameters are updated exactly; bf16 ones (pure bf16 training, no master weights) with
// stochastic rounding seeded by OptimConfig::seed (kernels/cpu/adamw.h).
#pragma once

#include "memfit/kernels/cpu/adamw.h"
#include "memfit/optim/optimizer.h"

namespace memfit {

class AdamW : public Optimizer {
 public:
  AdamW(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool);
  void step(Tensor& params, const Tensor& grads, float lr, float grad_scale) override;
  // kernels::adamw_update_master: the update and the rounding into `working` in one pass.
  void step_master(Tensor& master, Tensor& working, const Tensor& grads, float lr,
                   float grad_scale) override;
  std::string name() const override { return "adamw"; }
  std::vector<std::pair<std::string, Tensor>> state() override;
  size_t state_bytes() const override;
  // Bytes AdamW allocates for a layout, without allocating: 2 FP32 slabs.
  static size_t state_bytes_for(const ParamLayout& layout);

 private:
  kernels::AdamWHyper hyper(const ParamInfo& p, float lr) const;  // decay on decay tensors only
  OptimConfig config_;
  const ParamLayout& layout_;
  Tensor m_, v_;
};

}  // namespace memfit
