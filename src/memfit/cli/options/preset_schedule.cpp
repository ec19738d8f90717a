#include "memfit/cli/options/preset_schedule.h"

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/model/model_config.h"

namespace memfit {

namespace {

struct Entry {
  const char* preset;
  PresetSchedule schedule;
};

// Every value with its source. Each decays to 10% of the peak, but the 405B to its paper's 1%:
// GPT-3 ("cosine decay for learning rate down to 10% of its value", section 2.2 and appendix
// B), Llama 2 ("decay final learning rate down to 10% of the peak", section 2.2) and TinyLlama
// (4e-4 to 4e-5).
const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = {
      // GPT-2 (Radford et al. 2019) publishes no rates ("manually tuned for the best perplexity
      // on a 5% held-out sample of WebText"). The GPT-3 paper (Brown et al. 2020, Table 2.1)
      // publishes them for the same sizes (Small 125M 6.0e-4, Medium 350M 3.0e-4, Large 760M
      // 2.5e-4, XL 1.3B 2.0e-4), as nanoGPT and llm.c use for their GPT-2 runs. Its warmup is
      // 375M tokens (appendix B), not steps: at memfit's CPU batch sizes that is tens of
      // thousands of steps, so it is left to --warmup (0).
      {"gpt2", {6e-4f, 0, 6e-5f,
        "GPT-3 paper, Table 2.1, 125M; its warmup is in tokens"}},
      {"gpt2-medium", {3e-4f, 0, 3e-5f,
        "GPT-3 paper, Table 2.1, 350M; its warmup is in tokens"}},
      {"gpt2-large", {2.5e-4f, 0, 2.5e-5f,
        "GPT-3 paper, Table 2.1, 760M; its warmup is in tokens"}},
      {"gpt2-xl", {2e-4f, 0, 2e-5f,
        "GPT-3 paper, Table 2.1, 1.3B; its warmup is in tokens"}},
      // TinyLlama (Zhang et al. 2024, arXiv 2401.02385, section 2.3): 4e-4 to 4e-5 cosine, 2,000
      // warmup steps.
      {"tinyllama-1.1b", {4e-4f, 2000, 4e-5f, "TinyLlama paper, section 2.3"}},
      // Llama 2 (Touvron et al. 2023, arXiv 2307.09288, section 2.2 and Table 1): 7B at 3.0e-4,
      // 2,000 warmup steps.
      {"llama2-7b", {3e-4f, 2000, 3e-5f, "Llama 2 paper, section 2.2 and Table 1, 7B"}},
      // Meta publishes no rate for Llama 3 8B or Llama 3.2 1B (the Llama 3 paper, section
      // 3.4.1, gives only the 405B's 8e-5): the published model nearest in size, said as such.
      {"llama3-8b", {3e-4f, 2000, 3e-5f, "Llama 2 7B's, Meta published none for Llama 3 8B"}},
      {"llama3.2-1b",
       {4e-4f, 2000, 4e-5f, "TinyLlama 1.1B's, Meta published none for Llama 3.2 1B"}},
      // Llama 2 70B: 1.5e-4 (the Llama 2 paper, Table 1); the Llama 3 paper gives the 405B's
      // (section 3.4.1: 8e-5, 8,000 warmup steps, cosine to 8e-7, so 1% of the peak, not 10%).
      {"llama3-70b",
       {1.5e-4f, 2000, 1.5e-5f, "Llama 2 70B's, Meta published none for Llama 3 70B"}},
      {"llama3.1-405b", {8e-5f, 8000, 8e-7f, "Llama 3 paper, section 3.4.1, 405B"}},
  };
  return table;
}

}  // namespace

std::optional<PresetSchedule> preset_schedule(std::string_view preset) {
  for (const Entry& e : entries())
    if (preset == e.preset) return e.schedule;
  return std::nullopt;
}

std::string schedule_preset(const TrainConfig& c, StartingCheckpoint* start) {
  if (!c.model.empty()) return c.model;
  if (c.resume_dir.empty() && c.init_from.empty()) return TrainConfig::kDefaultModel;
  const ModelConfig model = start ? start->model().config : resolve_run_model(c).config;
  for (const std::string& name : ModelConfig::preset_names())
    if (ModelConfig::preset(name) == model) return name;
  return "";
}

std::string apply_preset_schedule(TrainConfig& c, ScheduleGiven given,
                                  StartingCheckpoint* start) {
  const std::string name = schedule_preset(c, start);
  const std::optional<PresetSchedule> p = preset_schedule(name);
  if (!p) return "";
  if (!given.lr) c.schedule.lr = p->lr;
  if (!given.warmup) c.schedule.warmup = p->warmup;
  // The floor keeps its ratio to the peak in effect (the table's own where --lr is not given).
  if (!given.min_lr)
    c.schedule.min_lr = given.lr ? static_cast<float>(double(c.schedule.lr) * p->min_lr / p->lr)
                                 : p->min_lr;
  std::vector<std::string> won;
  if (given.lr) won.push_back(fmt::format("--lr {:g}", c.schedule.lr));
  if (given.warmup) won.push_back(fmt::format("--warmup {}", c.schedule.warmup));
  if (given.min_lr) won.push_back(fmt::format("--min-lr {:g}", c.schedule.min_lr));
  return fmt::format("preset {}: lr {:g}, warmup {}, min-lr {:g} ({}); the command line wins{}",
                     name, p->lr, p->warmup, p->min_lr, p->source,
                     won.empty() ? std::string() : fmt::format(": {}", fmt::join(won, ", ")));
}

}  // namespace memfit
