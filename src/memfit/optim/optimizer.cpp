// make_optimizer and optimizer_state_bytes: the one place that maps an optimizer's name to its
// class, so the CLI's --optim and the planner agree on what each name allocates.
#include "memfit/optim/optimizer.h"

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/optim/adam_mini.h"
#include "memfit/optim/adamw.h"
#include "memfit/optim/adamw8bit.h"
#include "memfit/optim/lion.h"
#include "memfit/optim/lion8bit.h"
#include "memfit/optim/sgd.h"

namespace memfit {

void Optimizer::step_master(Tensor& master, Tensor& working, const Tensor& grads, float lr,
                            float grad_scale) {
  step(master, grads, lr, grad_scale);
  kernels::convert(working, master);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config, const ParamLayout& layout,
                                          MemoryPool& pool) {
  check_optim_config(config);
  const std::string& n = config.name;
  if (n == "adamw") return std::make_unique<AdamW>(config, layout, pool);
  if (n == "adamw8bit") return std::make_unique<AdamW8bit>(config, layout, pool);
  if (n == "lion") return std::make_unique<Lion>(config, layout, pool);
  if (n == "lion8bit") return std::make_unique<Lion8bit>(config, layout, pool);
  if (n == "adam-mini") return std::make_unique<AdamMini>(config, layout, pool);
  if (n == "sgd") return std::make_unique<Sgd>(config, layout, pool);
  MEMFIT_THROW(ConfigError, "optim", "optimizer '{}' is known but not constructed here", n);
}

size_t optimizer_state_bytes(const OptimConfig& config, const ParamLayout& layout) {
  check_optim_config(config);
  const std::string& n = config.name;
  if (n == "adamw") return AdamW::state_bytes_for(layout);
  if (n == "adamw8bit") return AdamW8bit::state_bytes_for(layout);
  if (n == "lion") return Lion::state_bytes_for(layout);
  if (n == "lion8bit") return Lion8bit::state_bytes_for(layout);
  if (n == "adam-mini") return AdamMini::state_bytes_for(layout, config.n_head);
  if (n == "sgd") return Sgd::state_bytes_for(layout);
  MEMFIT_THROW(ConfigError, "optim", "optimizer '{}' is known but not sized here", n);
}

}  // namespace memfit
