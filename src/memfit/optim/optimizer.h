// The optimizer interface. An optimizer owns its state slabs (Category::optimizer), walks the
// parameter layout (so it knows names, shapes, roles and which tensors take weight decay) and
// updates the parameter slab from the gradient slab in place.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memfit/core/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optim_config.h"

namespace memfit {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update. grad_scale multiplies every gradient before use (1/accumulation, clipping).
  virtual void step(Tensor& params, const Tensor& grads, float lr, float grad_scale) = 0;
  // The same on FP32 master weights, and `working` (bf16 or f16, the copy forward and backward
  // read) = the updated master rounded to nearest even. Bit-identical to step() followed by a
  // conversion; AdamW does both in one pass over the weights (one read of the master instead of
  // two), the others convert each tensor right after updating it, while it is in cache.
  virtual void step_master(Tensor& master, Tensor& working, const Tensor& grads, float lr,
                           float grad_scale);
  virtual std::string name() const = 0;
  // The state tensors by name, for checkpoints; loading writes into these same tensors.
  virtual std::vector<std::pair<std::string, Tensor>> state() = 0;
  // Exact bytes of state this optimizer allocated (what the planner predicts).
  virtual size_t state_bytes() const = 0;

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }

 protected:
  int64_t t_ = 0;
};

// The optimizer `config.name` names (optimizer_names() lists them), after check_optim_config.
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config, const ParamLayout& layout,
                                          MemoryPool& pool);
// The bytes make_optimizer(config, layout, ...) would allocate, without allocating: each
// optimizer's state_bytes_for. This is what the planner predicts.
size_t optimizer_state_bytes(const OptimConfig& config, const ParamLayout& layout);

}  // namespace memfit
