// --lora-from ADAPTER_DIR: a LoRA run whose adapters start from PEFT's files (memfit's own save
// or another tool's) on the base model of --init-from. The adapters' shape is theirs: rank,
// alpha and targets come from adapter_config.json, and an option given that says otherwise is
// refused naming it, rather than training adapters of another shape from scratch. Note [LoRA]
// in docs/notes/lora.md.
#pragma once

#include "memfit/model/model_config.h"
#include "memfit/cli/options/train_config.h"

namespace memfit {

// Which of --lora-rank, --lora-alpha and --lora-targets the command line gave.
struct LoraOptionsGiven {
  bool rank = false, alpha = false, targets = false;
};

// With --lora-from set in `config`: its rank, alpha and targets (read_lora_options, for a model
// of `model`) into config.lora; --lora-dropout stays as given. ConfigError (exit 2) without
// --init-from, or where a given option differs from the adapters' (naming the option, its
// value and the config's field and value); IoError for a directory without adapters.
// Nothing without --lora-from.
void adopt_lora_from(TrainConfig& config, const ModelConfig& model, LoraOptionsGiven given);

}  // namespace memfit
