#include "memfit/cli/options/train_from_config.h"

#include "memfit/cli/options/resolve_train_spec.h"

namespace memfit {

TrainSummary train(const TrainConfig& config) {
  dist::ProcessGrid grid(dist::make_single_communicator(), dist::GridShape{});
  return train(config, grid);
}

TrainSummary train(const TrainConfig& config, dist::ProcessGrid& grid) {
  TrainConfig c = config;
  c.ranks = grid.world().size();
  // --ckpt auto and --auto-batch become the planner's choice first: the run, its checkpoints and
  // trainer_state.json have a policy and a micro-batch, never "auto".
  AutoResolution resolved = resolve_auto(c);  // and --precision auto, resolved
  adopt_lead_choice(resolved, grid.world());  // rank 0's choice is every rank's
  return train(resolved.train, grid);
}

}  // namespace memfit
