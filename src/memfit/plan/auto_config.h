// --ckpt auto and --auto-batch: the planner's search (plan/search.h) for a run's config,
// and the config the run is then built from. `memfit train` and `memfit plan --auto` share it,
// and train() calls it too, so a config with "auto" means the same everywhere.
#pragma once

#include <string>

#include "memfit/plan/search.h"
#include "memfit/train/train_config.h"

namespace memfit {

// The search a config asks for: the policy when --ckpt auto, the micro-batch with
// --auto-batch, under parse_bytes(--mem-limit). A resumed run keeps its checkpoint's
// micro-batch (a resume must continue with the same one): `note`, if given, says so.
// ConfigError without --mem-limit; nothing fitting is a result, not an error.
SearchResult plan_auto(const TrainConfig& config, std::string* note = nullptr);

// --precision auto resolved in `config`: a resumed run keeps its checkpoint's precision (the
// trainer refuses another), else auto_precision() picks by the CPU. Returns the sentence to
// print once at start ("--precision auto: bf16: ..."); empty when the config did not say auto.
std::string resolve_precision(TrainConfig& config);

struct AutoResolution {
  TrainConfig config;  // the run to build: a policy, not "auto"; auto_batch false; a precision
  std::string precision_note;  // resolve_precision's sentence
  bool planned = false;  // the planner chose (config asked for --ckpt auto or --auto-batch)
  SearchResult search;   // when planned
  std::string note;      // when planned: anything the search was told (resume)
};

// The config a run is built from: its precision resolved, and unchanged otherwise unless it asks
// for the planner, else with the search's choice. Throws ConfigError as plan_auto, and OutOfMemoryError when nothing fits:
// the smallest footprint, its largest part, and the planner's advice on other options
// (plan/fit_advice.h).
AutoResolution resolve_auto(const TrainConfig& config);

}  // namespace memfit
