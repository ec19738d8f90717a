// The dynamic loss scaler's transitions (Megatron-LM's DynamicGradScaler, which DeepSpeed's
// DynamicLossScaler matches with delayed_shift = hysteresis) and its JSON state.
#include "memfit/train/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "memfit/core/error.h"

namespace memfit {

void LossScalerConfig::validate() const {
  auto bad = [](const char* what, auto value) {
    MEMFIT_THROW(ConfigError, "loss_scaler", "{}, got {}", what, value);
  };
  if (!(std::isfinite(min_scale) && min_scale > 0))
    bad("min_scale must be finite and > 0", min_scale);
  if (!(std::isfinite(max_scale) && max_scale >= min_scale))
    bad("max_scale must be finite and >= min_scale", max_scale);
  if (!(initial_scale >= min_scale && initial_scale <= max_scale))
    bad("initial_scale must lie in [min_scale, max_scale]", initial_scale);
  if (!(growth_factor > 1 && std::isfinite(growth_factor)))
    bad("growth_factor must be > 1", growth_factor);
  if (!(backoff_factor > 0 && backoff_factor < 1))
    bad("backoff_factor must be in (0, 1)", backoff_factor);
  if (window < 1) bad("window must be >= 1", window);
  if (hysteresis < 1) bad("hysteresis must be >= 1", hysteresis);
}

DynamicLossScaler::DynamicLossScaler(const LossScalerConfig& config)
    : config_(config), scale_(config.initial_scale), hysteresis_left_(config.hysteresis) {
  config_.validate();
}

bool DynamicLossScaler::update(bool overflow) {
  ++steps_;
  if (overflow) {
    ++skipped_;
    clean_steps_ = 0;
    hysteresis_left_ = std::max(0, hysteresis_left_ - 1);
    if (hysteresis_left_ == 0)
      scale_ = std::max(scale_ * config_.backoff_factor, config_.min_scale);
    return true;
  }
  if (config_.consecutive_hysteresis) hysteresis_left_ = config_.hysteresis;
  if (++clean_steps_ >= config_.window) {
    clean_steps_ = 0;
    hysteresis_left_ = config_.hysteresis;
    scale_ = std::min(scale_ * config_.growth_factor, config_.max_scale);
  }
  return false;
}

nlohmann::json DynamicLossScaler::to_json() const {
  const LossScalerConfig& c = config_;
  return {{"scale", scale_},
          {"clean_steps", clean_steps_},
          {"hysteresis_left", hysteresis_left_},
          {"steps", steps_},
          {"skipped", skipped_},
          {"config",
           {{"initial_scale", c.initial_scale},
            {"growth_factor", c.growth_factor},
            {"backoff_factor", c.backoff_factor},
            {"window", c.window},
            {"hysteresis", c.hysteresis},
            {"consecutive_hysteresis", c.consecutive_hysteresis},
            {"min_scale", c.min_scale},
            {"max_scale", c.max_scale}}}};
}

void DynamicLossScaler::load_json(const nlohmann::json& j) {
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key) || !j.at(key).is_number())
      MEMFIT_THROW(ConfigError, "loss_scaler", "state lacks a number '{}': {}", key, j.dump());
    return j.at(key);
  };
  // Counts must be integers: a float such as 1e30 has no int64_t (found by fuzz/).
  auto count = [&](const char* key) -> int64_t {
    if (!field(key).is_number_integer())
      MEMFIT_THROW(ConfigError, "loss_scaler", "state's '{}' must be an integer: {}", key, j.dump());
    return j.at(key).get<int64_t>();
  };
  const float scale = field("scale").get<float>();
  const int64_t clean = count("clean_steps");
  const int64_t left = count("hysteresis_left");
  const int64_t steps = count("steps"), skipped = count("skipped");
  if (!(std::isfinite(scale) && scale > 0) || clean < 0 || left < 0 || steps < 0 || skipped < 0 ||
      skipped > steps)
    MEMFIT_THROW(ConfigError, "loss_scaler", "state is not valid: {}", j.dump());
  // A resumed run may have changed the config: clamp the state into it.
  scale_ = std::clamp(scale, config_.min_scale, config_.max_scale);
  clean_steps_ = clean;
  hysteresis_left_ = static_cast<int>(std::min<int64_t>(left, config_.hysteresis));
  steps_ = steps;
  skipped_ = skipped;
}

}  // namespace memfit
