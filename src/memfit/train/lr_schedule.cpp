#include "memfit/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "memfit/core/error.h"

namespace memfit {

void LrSchedule::validate() const {
  if (kind != "cosine" && kind != "constant")
    MEMFIT_THROW(ConfigError, "config", "lr-schedule must be cosine or constant, got '{}'", kind);
  if (!(lr > 0) || !(min_lr >= 0) || min_lr > lr)
    MEMFIT_THROW(ConfigError, "config", "need 0 <= min-lr <= lr and lr > 0, got lr {} min-lr {}",
                 lr, min_lr);
  if (warmup < 0) MEMFIT_THROW(ConfigError, "config", "warmup must be >= 0, got {}", warmup);
}

nlohmann::json LrSchedule::to_json() const {
  return {{"kind", kind}, {"lr", lr}, {"min_lr", min_lr}, {"warmup", warmup}, {"total", total}};
}

float LrSchedule::at(int64_t step) const {
  if (step < warmup) return lr * static_cast<float>(step + 1) / static_cast<float>(warmup);
  if (kind == "constant") return lr;
  const int64_t decay_steps = std::max<int64_t>(1, total - warmup - 1);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / decay_steps);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(min_lr + (lr - min_lr) * cosine);
}

}  // namespace memfit
