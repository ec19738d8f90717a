// Dynamic loss scaling for FP16 training: the loss (in practice the gradient seed dloss) is
// multiplied by a scale so that small gradients do not flush to zero in half precision; a step
// whose gradients overflowed is skipped and, with hysteresis, the scale backs off; after a
// window of clean steps it grows again. A pure state machine: the trainer asks scale(), runs
// the step, checks the gradients (kernels::unscale_and_check) and calls update(overflow).
// The policy and its reasoning: docs/notes/mixed-precision.md, "Dynamic loss scaling".
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>

namespace memfit {

struct LossScalerConfig {
  float initial_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;      // times the scale after `window` clean steps in a row
  float backoff_factor = 0.5f;     // times the scale when an overflow exhausts the hysteresis
  int64_t window = 1000;           // clean steps in a row before the scale grows
  // Overflowing steps tolerated before the scale is cut, as DeepSpeed's `delayed_shift` and
  // Megatron's `hysteresis`: the scale is cut on the hysteresis-th overflow counted since the
  // start or the last growth, and on every overflow after that until the next growth. 1 cuts
  // on every overflow. Every overflowing step is skipped either way.
  int hysteresis = 2;
  // DeepSpeed's consecutive_hysteresis: any clean step restores the full hysteresis, so only
  // `hysteresis` overflows in a row cut the scale. Off by default, as in DeepSpeed and Megatron.
  bool consecutive_hysteresis = false;
  float min_scale = 1.0f;         // the scale never goes below this
  float max_scale = 16777216.0f;  // 2^24: nor above this, so it stays finite in long runs

  // Throws ConfigError naming the first bad value.
  void validate() const;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScalerConfig& config = {});

  // The factor the loss (dloss) is multiplied by this step, and its inverse for unscaling.
  // With the default factors the scale is a power of two, so scaling is exact.
  float scale() const { return scale_; }
  float inv_scale() const { return 1.0f / scale_; }

  // Records a step: `overflow` says whether any gradient was inf or NaN. Returns true if the
  // step must be skipped (exactly when it overflowed): no optimizer update, no schedule step.
  bool update(bool overflow);

  const LossScalerConfig& config() const { return config_; }
  int64_t clean_steps() const { return clean_steps_; }      // in a row, since the last growth
  int hysteresis_left() const { return hysteresis_left_; }  // overflows left before a cut
  int64_t steps() const { return steps_; }
  int64_t skipped() const { return skipped_; }

  // State for checkpoints: {"scale", "clean_steps", "hysteresis_left", "steps", "skipped"} and
  // the config under "config" (for the record; load_json keeps this object's config).
  nlohmann::json to_json() const;
  // Restores the state saved by to_json; throws ConfigError on a missing or bad field.
  void load_json(const nlohmann::json& j);

 private:
  LossScalerConfig config_;
  float scale_;
  int64_t clean_steps_ = 0;
  int hysteresis_left_;
  int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace memfit
