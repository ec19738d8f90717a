// The training loop of `memfit train`: micro-batches with gradient accumulation, global-norm
// clipping, the learning-rate schedule, evaluation, a JSON-lines log, the progress line, and
// atomic checkpoints that resume bit-identically.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/dist/process_grid.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/memory/category.h"
#include "memfit/profile/leak_check.h"
#include "memfit/train/train_spec.h"

namespace memfit {

struct TrainSummary {
  int64_t steps_run = 0;      // optimizer steps taken in this run
  int64_t last_step = 0;      // 1-based number of the last step taken (resume included)
  float last_loss = 0;
  float last_val_loss = -1;   // -1 if never evaluated
  double unigram_entropy = 0; // nats per token of the training data's unigram distribution
  double median_tokens_per_s = 0;
  double wall_seconds = 0;
  size_t peak_bytes = 0;
  CategoryBytes peak_by_category{};
  std::vector<float> losses;  // per step of this run
  int64_t skipped_steps = 0;  // fp16: steps skipped for overflowing gradients
  // The run's checkpoint policy, compression and micro-batch: the planner's choice under
  // --ckpt auto and --auto-batch.
  std::string ckpt;
  std::string act_compress;  // none, int8 or fp8: given, the checkpoint's, or the planner's
  int batch = 0, grad_accum = 0;
  // SIGINT or SIGTERM stopped the run after last_step (train/interrupt.h); 0 if it ran out.
  int interrupted_by = 0;
  bool saved = false;  // a checkpoint of last_step is in --save's directory
  int rank = 0;        // this process's rank (data parallelism): rank 0 reports the run
  // The leak check over the run's step boundaries (profile/leak_check.h).
  profile::LeakReport leak;
  // --profile: where this rank's files are and the summary to print.
  std::string profile_dir, profile_text;
};

// Runs the resolved run `spec` (train/train_spec.h: the options parsed once, the planner's
// choice made) as one rank of `grid` (one process, or under mpirun or srun): data parallelism
// over its data group, each rank reading its rows of every global micro-batch, gradients and
// losses summed over the group, and the world's rank 0 logging and saving. Every rank must call
// it with the same run (resolved for grid.data().size() ranks, rank 0's search choice adopted:
// the command line's resolution does both, cli/options/resolve_train_spec.h); the ranks check that they agree before anything is built. A SIGINT or
// SIGTERM stops it after the step in progress, saved as at the end
// (TrainSummary::interrupted_by). Throws ConfigError/IoError for bad input, OutOfMemoryError when
// the budget is too small, Error when the loss becomes non-finite; none of them leaves a partial
// checkpoint behind. The grid has data parallelism only today (tensor and pipeline 1).
// (From options as given, as the tests do: cli/options/train_from_config.h.)
TrainSummary train(const TrainSpec& spec, dist::ProcessGrid& grid);

}  // namespace memfit
