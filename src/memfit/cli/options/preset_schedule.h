// The learning-rate schedule a model preset was published with (peak rate, warmup steps, and
// the cosine floor), so `memfit train --model llama2-7b` starts from
// Meta's 3e-4 with 2,000 warmup steps instead of a 124M GPT-2's 6e-4 with none. What the
// command line or a --config file gives wins, option by option. Test-sized presets (gpt2-tiny,
// gpt2-small-test, llama-tiny) carry nothing and keep TrainConfig's defaults.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "memfit/cli/options/train_config.h"

namespace memfit {

class StartingCheckpoint;  // resolve_train_spec.h

struct PresetSchedule {
  float lr = 0;            // peak
  int64_t warmup = 0;      // linear warmup steps
  float min_lr = 0;        // the cosine's floor (with --lr given, the same fraction of it)
  const char* source = "";  // where the numbers come from, printed with them
};

// The preset's published schedule; nullopt for a preset without one (or an unknown name).
std::optional<PresetSchedule> preset_schedule(std::string_view preset);

// Which of --lr, --warmup and --min-lr the command line or the --config file gave.
struct ScheduleGiven {
  bool lr = false, warmup = false, min_lr = false;
};

// The preset whose schedule the run takes: the one --model names; else, with --resume or
// --init-from, the preset whose shape the checkpoint's model has (none if it has no preset's);
// else TrainConfig::kDefaultModel.
// `start`, if given, reads the checkpoint's model (once for the whole resolution:
// resolve_train_spec.h); else it is read here.
std::string schedule_preset(const TrainConfig& config, StartingCheckpoint* start = nullptr);

// Sets the schedule options `given` leaves open to schedule_preset's published values (with
// --lr given and --min-lr not, the floor is the same fraction of the given peak). Returns the
// line to print at start, e.g. "preset llama2-7b: lr 0.0003, warmup 2000, min-lr 3e-05 (...);
// the command line wins", then the options given; empty when the preset carries none.
std::string apply_preset_schedule(TrainConfig& config, ScheduleGiven given,
                                  StartingCheckpoint* start = nullptr);

}  // namespace memfit
