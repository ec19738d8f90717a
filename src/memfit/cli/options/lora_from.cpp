#include "memfit/cli/options/lora_from.h"

#include <filesystem>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/checkpoint/lora_adapter.h"

namespace memfit {

void adopt_lora_from(TrainConfig& c, const ModelConfig& model, LoraOptionsGiven given) {
  const Family family = model.family;
  if (c.lora_from.empty()) return;
  if (c.init_from.empty())
    MEMFIT_THROW(ConfigError, "config",
                 "--lora-from {} needs --init-from BASE, the base model its adapters were "
                 "trained on{}",
                 c.lora_from,
                 c.resume_dir.empty() ? "" : " (--resume reads a LoRA save's own adapters)");
  const std::filesystem::path dir = c.lora_from;
  if (!io::has_lora_adapter(dir))
    MEMFIT_THROW(IoError, "config", "--lora-from {}: no {} there", c.lora_from,
                 io::kAdapterConfigFile);
  const LoraOptions saved = io::read_lora_options(dir, model);
  auto differs = [&](const char* option, const std::string& value, const char* field,
                     const std::string& theirs) {
    MEMFIT_THROW(ConfigError, "config",
                 "--lora-from {}: {} {} differs from its {}'s {} {} (leave {} out: --lora-from "
                 "takes the adapters' rank, alpha and targets from them)",
                 c.lora_from, option, value, io::kAdapterConfigFile, field, theirs, option);
  };
  if (given.rank && c.lora.rank != saved.rank)
    differs("--lora-rank", std::to_string(c.lora.rank), "r", std::to_string(saved.rank));
  if (given.alpha && c.lora.alpha != saved.alpha)
    differs("--lora-alpha", fmt::format("{}", c.lora.alpha), "lora_alpha",
            fmt::format("{}", saved.alpha));
  if (given.targets) {
    LoraOptions asked = saved;
    asked.targets = c.lora.targets;
    if (lora_chosen_targets(asked, family) != lora_chosen_targets(saved, family))
      differs("--lora-targets", c.lora.targets, "target_modules", saved.targets);
  }
  c.lora.rank = saved.rank;
  c.lora.alpha = saved.alpha;
  c.lora.targets = saved.targets;
}

}  // namespace memfit
