// Learning-rate schedules: linear warmup, then cosine decay to a floor, or constant.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace memfit {

struct LrSchedule {
  std::string kind = "cosine";  // cosine | constant
  float lr = 6e-4f;             // peak
  float min_lr = 6e-5f;         // cosine's floor, reached at the last step
  int64_t warmup = 0;           // steps of linear warmup from lr/warmup to lr
  int64_t total = 1;            // steps in the run

  // Learning rate of step `step` (0-based). Throws ConfigError for an unknown kind.
  float at(int64_t step) const;
  void validate() const;
  // {"kind", "lr", "min_lr", "warmup", "total"}: trainer_state.json's "schedule", which a resume
  // compares with its own (train/resume_state.h, schedule_changes).
  nlohmann::json to_json() const;
};

}  // namespace memfit
