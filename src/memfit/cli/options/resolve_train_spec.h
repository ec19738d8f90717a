// The options of `memfit train` / `memfit plan` as given (TrainConfig: strings, as the command
// line and TOML files give them) checked once and resolved into the typed RunSpec the planner
// reads (plan/run_spec.h) and the TrainSpec train() takes (train/train_spec.h); --precision
// auto, --ckpt auto, --auto-batch and --zero auto resolved before anything is built. `memfit
// train` and `memfit plan` share it, so "auto" means the same everywhere. The only place the
// options' strings are parsed (they stay in cli/), and the checkpoint a run starts from is read
// here, once.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "memfit/cli/options/train_config.h"
#include "memfit/dist/communicator.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/plan/run_spec.h"
#include "memfit/plan/search.h"
#include "memfit/train/train_spec.h"

namespace memfit {

// --tp-overlap: true for "on", false for "off", else ConfigError naming the value.
bool parse_tp_overlap(const std::string& value);

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

// The checkpoint a run starts from (--resume or --init-from), located and read at most once,
// when first asked, however many steps of the resolution ask: its config.json (checked against
// the options: resolve_run_model) and, resuming, its trainer_state.json. Without a checkpoint
// it reads nothing.
class StartingCheckpoint {
 public:
  explicit StartingCheckpoint(const TrainConfig& config);
  // resolve_run_model's answer (ConfigError where the options name another model).
  const RunModel& model();
  // The resumed checkpoint's trainer_state.json, or an empty object where there is none or it
  // cannot be read (the trainer's own resume checks then report what is wrong).
  const nlohmann::json& state();
  // Where it is, and the text the trainer parses (RunCheckpoint).
  RunCheckpoint checkpoint();

 private:
  TrainConfig config_;  // the options the model is checked against
  std::optional<RunModel> model_;
  std::optional<std::string> state_text_;
  std::optional<nlohmann::json> state_;
};

// The config checked (validate_train_config) and resolved: the model (resolve_run_model),
// --mem-limit in bytes, the policy, precision, attention and optimizer as types. --precision
// auto must be resolved first (resolve_precision). The only place these options are parsed.
// `location`, if given, gets where the checkpoint was found (resolve_run_model's).
RunSpec resolve_run(const TrainConfig& config, io::CheckpointLocation* location = nullptr);
RunSpec resolve_run(const TrainConfig& config, StartingCheckpoint& start);

// --precision auto resolved in `config`: a resumed run keeps its checkpoint's precision (the
// trainer refuses another), else auto_precision() picks by the CPU. Returns the sentence to
// print once at start ("--precision auto: bf16: ..."); empty when the config did not say auto.
std::string resolve_precision(TrainConfig& config);
std::string resolve_precision(TrainConfig& config, StartingCheckpoint& start);

// The search a run asks for (spec = resolve_run(config)): the policy when --ckpt auto, the
// micro-batch with --auto-batch, under --mem-limit. A resumed run keeps its checkpoint's
// micro-batch (a resume must continue with the same one): `note`, if given, says so.
// ConfigError without --mem-limit; nothing fitting is a result, not an error.
SearchResult plan_auto(const TrainConfig& config, const RunSpec& spec, std::string* note = nullptr);
SearchResult plan_auto(const TrainConfig& config, const RunSpec& spec, std::string* note,
                       StartingCheckpoint& start);

struct AutoResolution {
  // The run to build, typed: a policy, not "auto"; a micro-batch, a stage and a precision; the
  // search's choice made (train.run is apply_candidate(asked, search.choice)).
  TrainSpec train;
  RunSpec asked;               // resolve_run(config): the run before the search's choice
  std::string precision_note;  // resolve_precision's sentence
  bool planned = false;  // the planner chose (config asked for --ckpt/--zero auto or --auto-batch)
  SearchResult search;   // when planned
  std::string note;      // when planned: anything the search was told (resume)
  // --pp-layers auto: how the planner cut the stages (StageSplit::why); empty otherwise.
  std::string pipeline_note;
  const RunSpec& spec() const { return train.run; }
};

// The run to build: its precision resolved, and unchanged otherwise unless it asks for the
// planner, else with the search's choice. Throws ConfigError as plan_auto, and OutOfMemoryError
// when nothing fits: the smallest footprint, its largest part, and the planner's advice on
// other options (plan/fit_advice.h). `start`, if given, is the run's checkpoint as read so far
// (the command reads it once for every step: apply_preset_schedule, this).
AutoResolution resolve_auto(const TrainConfig& config);
AutoResolution resolve_auto(const TrainConfig& config, StartingCheckpoint& start);

// The loop's settings of `config` typed, beside `run` (resolved from it): what train() takes.
TrainSpec train_spec(const TrainConfig& config, const RunSpec& run, StartingCheckpoint& start);

// Over several ranks, rank 0's choice is every rank's (collective; nothing to do with one rank
// or when the run asked for no search). The search is the same on every rank, but its
// estimates read each process's calibration: ranks that measured their own (no cache yet, or
// hosts with other CPUs) could pick different configurations when two are close in time. So
// rank 0 broadcasts its choice (the search's Candidate as JSON: plan/search.h), and every other
// rank applies it to the run it asked for (it fits: what fits is planned from bytes alone, the
// same on every rank).
void adopt_lead_choice(AutoResolution& resolution, dist::Communicator& comm);

// --max-model varies the shape (and, with --ckpt unset or auto, the policy): ConfigError if the
// config fixes --n-layer, --d-model, --n-head, --n-kv-head, --ffn-dim, a --ckpt layers: list
// (which cannot hold at every depth), --resume or --init-from; or gives no --mem-limit.
void check_max_model_config(const TrainConfig& config);

}  // namespace memfit
