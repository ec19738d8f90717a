// Run setup: a `memfit train` / `memfit plan` config (strings, as the command line and TOML
// files give them) checked once and resolved into the typed RunSpec the planner and the trainer
// read (plan/run_spec.h); --precision auto, --ckpt auto and --auto-batch resolved before
// anything is built. `memfit train`, `memfit plan` and train() share it, so "auto" means the same
// everywhere.
#pragma once

#include <string>

#include "memfit/dist/communicator.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/plan/run_spec.h"
#include "memfit/plan/search.h"
#include "memfit/train/train_config.h"

namespace memfit {

// Throws ConfigError naming the first setting `train` would refuse, before anything is
// allocated or read (resolve_run calls it).
void validate_train_config(const TrainConfig& config);

// The model a run trains and its sequence length: from the checkpoint's config.json when
// resuming or initialising from one (location says where it was found), else the preset with
// the config's overrides. ConfigError if the sequence is longer than the model's context.
struct RunModel {
  ModelConfig config;
  int T = 0;
  io::CheckpointLocation location;  // dir empty without a checkpoint
};
RunModel resolve_run_model(const TrainConfig& config);

// The config checked (validate_train_config) and resolved: the model (resolve_run_model),
// --mem-limit in bytes, the policy, precision, attention and optimizer as types. --precision
// auto must be resolved first (resolve_precision). The only place these options are parsed.
// `location`, if given, gets where the checkpoint was found (resolve_run_model's).
RunSpec resolve_run(const TrainConfig& config, io::CheckpointLocation* location = nullptr);

// --precision auto resolved in `config`: a resumed run keeps its checkpoint's precision (the
// trainer refuses another), else auto_precision() picks by the CPU. Returns the sentence to
// print once at start ("--precision auto: bf16: ..."); empty when the config did not say auto.
std::string resolve_precision(TrainConfig& config);

// The search a run asks for (spec = resolve_run(config)): the policy when --ckpt auto, the
// micro-batch with --auto-batch, under --mem-limit. A resumed run keeps its checkpoint's
// micro-batch (a resume must continue with the same one): `note`, if given, says so.
// ConfigError without --mem-limit; nothing fitting is a result, not an error.
SearchResult plan_auto(const TrainConfig& config, const RunSpec& spec, std::string* note = nullptr);

struct AutoResolution {
  TrainConfig config;  // the run to build: a policy, not "auto"; auto_batch false; a precision
  RunSpec spec;        // resolve_run(config), the choice made
  io::CheckpointLocation location;  // of --resume or --init-from (dir empty without)
  std::string precision_note;  // resolve_precision's sentence
  bool planned = false;  // the planner chose (config asked for --ckpt auto or --auto-batch)
  SearchResult search;   // when planned
  std::string note;      // when planned: anything the search was told (resume)
};

// The run to build: its precision resolved, and unchanged otherwise unless it asks for the
// planner, else with the search's choice. Throws ConfigError as plan_auto, and OutOfMemoryError
// when nothing fits: the smallest footprint, its largest part, and the planner's advice on
// other options (plan/fit_advice.h).
AutoResolution resolve_auto(const TrainConfig& config);

// Over several ranks, rank 0's choice is every rank's (collective; nothing to do with one rank
// or when the run asked for no search). The search is the same on every rank, but its
// estimates read each process's calibration: ranks that measured their own (no cache yet, or
// hosts with other CPUs) could pick different configurations when two are close in time. So
// rank 0 broadcasts its policy, compression, micro-batch, stage and offload, and a rank whose
// choice differs takes rank 0's (it fits: what fits is planned from bytes alone, the same on
// every rank).
void adopt_lead_choice(AutoResolution& resolution, dist::Communicator& comm);

// --max-model varies the shape (and, with --ckpt unset or auto, the policy): ConfigError if the
// config fixes --n-layer, --d-model, --n-head, --n-kv-head, --ffn-dim, a --ckpt layers: list
// (which cannot hold at every depth), --resume or --init-from; or gives no --mem-limit.
void check_max_model_config(const TrainConfig& config);

}  // namespace memfit
