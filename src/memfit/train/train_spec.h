// A `memfit train` run resolved: what train() takes, typed. The options as given (strings, as
// the command line and TOML files give them) stay in cli/: they are checked and parsed once, by
// cli/options/resolve_train_spec.h (resolve_auto), into the RunSpec the planner plans and the
// search varies, plus the loop's own settings here; the checkpoint a run starts from is located
// and read there once too (RunCheckpoint). Nothing in train/ parses an option or decodes a name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/model/model_config.h"
#include "memfit/plan/run_spec.h"
#include "memfit/train/loss_scaler.h"
#include "memfit/train/lr_schedule.h"

namespace memfit {

// The checkpoint a run starts from (--resume or --init-from), read once when the run is
// resolved: the trainer loads from it without reading config.json or trainer_state.json again.
struct RunCheckpoint {
  io::CheckpointLocation location;  // dir empty without a checkpoint
  // Its config.json as read (the model the run was resolved from); what the weights are checked
  // against when they load (io::ReadCheckpoint).
  ModelConfig config;
  bool resume = false;              // --resume (the optimizer and trainer state too)
  std::string option;               // "--resume" or "--init-from" (empty without)
  std::string lora_from;            // --lora-from: the adapters' directory (empty without)
  // --resume: the text of its trainer_state.json; nullopt where it could not be read (the
  // trainer then reports the file's error where it loads the state).
  std::optional<std::string> state_text;
};

struct TrainSpec {
  RunSpec run;  // the model, shapes, precision, policy, placement options, budget: typed
  RunCheckpoint checkpoint;

  // How the run names its model: the preset, or the checkpoint it came from (the profile).
  std::string model_label;
  // Where the model's vocabulary came from, for the data loader's error on a token past it
  // ("preset gpt2-tiny", "--vocab"); empty for a checkpoint's model.
  std::string vocab_source;

  LrSchedule schedule;  // total: run.steps
  // --clip and --clip-mode: run.clip, run.clip_mode (the planner prices the passes they ask).
  uint64_t seed = 1337;
  double bucket_mb = 25;  // as given (run.bucket_bytes is what the exchange uses)
  LossScalerConfig loss_scaler;  // fp16
  bool repeat_batch = false;
  int64_t stop_after = 0;  // 0: run all run.steps

  int64_t eval_every = 0;  // 0: only at the end
  int eval_batches = 8;
  std::string save_dir;    // empty: no saves
  int64_t save_every = 0;  // 0: only at the end
  double save_every_minutes = 0;
  uint64_t max_shard_bytes = 0;  // --max-shard-size in bytes
  std::string log_file;          // JSON lines; empty: none
  std::string profile_dir;       // empty: no profile
  int64_t profile_steps = 3;
  bool fail_on_leak = false;
  int64_t test_leak_bytes = 0;  // the tests' deliberate leak (cli/options/train_config.h)
};

}  // namespace memfit
