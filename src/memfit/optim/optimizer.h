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

namespace memfit {

struct OptimConfig {
  std::string name = "adamw";  // adamw | adamw8bit | lion | lion8bit | adam-mini | sgd
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to ParamInfo::decay tensors only
  int n_head = 1;             // for partitions that follow attention heads (Adam-mini)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update. grad_scale multiplies every gradient before use (1/accumulation, clipping).
  virtual void step(Tensor& params, const Tensor& grads, float lr, float grad_scale) = 0;
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

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config, const ParamLayout& layout,
                                          MemoryPool& pool);

}  // namespace memfit
