#include "memfit/optim/optimizer.h"

#include "memfit/core/error.h"
#include "memfit/optim/adamw.h"

namespace memfit {

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& config, const ParamLayout& layout,
                                          MemoryPool& pool) {
  if (config.name == "adamw") return std::make_unique<AdamW>(config, layout, pool);
  MEMFIT_THROW(ConfigError, "optim", "unknown optimizer '{}'; known: adamw", config.name);
}

}  // namespace memfit
