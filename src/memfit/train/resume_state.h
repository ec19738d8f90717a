// Reading a checkpoint's trainer_state.json when a run resumes: where the run stands (step and
// data position) and the check that it is configured as the run that saved it. Kept apart from
// the trainer so the reader of these outside bytes can be fuzzed on its own (fuzz/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>

#include "memfit/train/train_config.h"

namespace memfit {

struct ResumeState {
  int64_t step = 0;           // optimizer steps taken when it was saved
  int64_t data_position = 0;  // the training loader's position
  nlohmann::json state;       // the whole object (the loss scaler's state, when there is one)
};

// Parses `text`, the contents of `file`, and checks it against `config` and the run's sequence
// length `T`. Throws IoError naming the file when it is not a JSON object or a field is missing
// or of the wrong type, and ConfigError naming the setting that differs from the saved run's.
ResumeState parse_trainer_state(std::string_view text, const TrainConfig& config, int T,
                                const std::filesystem::path& file);

}  // namespace memfit
