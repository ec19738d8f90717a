// The options as given (TrainConfig), resolved and run: what the tests and the benchmark tools
// call to start a run the way `memfit train` does, without a command line. train/ itself takes
// only the resolved TrainSpec (train/trainer.h); the strings stay here, in cli/.
#pragma once

#include "memfit/cli/options/train_config.h"
#include "memfit/dist/process_grid.h"
#include "memfit/train/trainer.h"

namespace memfit {

// `config` resolved (resolve_train_spec.h: resolve_auto, for the grid's data-parallel ranks,
// rank 0's choice adopted: adopt_lead_choice) and run by train(spec, grid). Throws as that
// does, and OutOfMemoryError also when the planner finds no choice that fits.
TrainSummary train(const TrainConfig& config);  // one process
TrainSummary train(const TrainConfig& config, dist::ProcessGrid& grid);

}  // namespace memfit
