// Pipeline parallelism's cut of the model (`--pp P`, `--pp-layers`; Note [Pipeline parallel]):
// P contiguous stages of blocks, the embeddings on the first and the final norm and LM head on
// the last. Only the cut lives here; the schedule of micro-batches over the stages is
// model/pipeline_schedule.h, the transfers between stages dist/'s point to point.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace memfit {

// Stage `index` of `stages`: blocks [first, last).
struct PipelineStage {
  int index = 0, stages = 1;
  int first = 0, last = 0;
  int blocks() const { return last - first; }
  bool has_embeddings() const { return index == 0; }       // and takes the tokens
  bool has_head() const { return index == stages - 1; }    // final norm, LM head, the loss
  bool operator==(const PipelineStage&) const = default;
};

// An even split by block count (every block of a model has the same shape, so the same
// parameters, activations and time): the cut a run starts from; `--pp-layers auto` then
// balances the stages by the planner's priced time (plan/pipeline_time.h, balance_stages).
// The n_layer % P blocks left over go to the middle stages first, then the first, then the
// last: the first stage already holds the most micro-batches in flight under 1F1B and the last
// the LM head. ConfigError naming --pp when P < 1 or P > n_layer (a stage without a block).
std::vector<PipelineStage> split_stages_evenly(int n_layer, int stages);

// Contiguous stages of counts[s] blocks each, in order (the even split's and the balanced
// cut's stages from their block counts).
std::vector<PipelineStage> stages_from_counts(const std::vector<int>& counts);

// `--pp-layers 5,7`: each stage's block count, P of them, each at least 1, summing to n_layer;
// ConfigError naming --pp-layers and the values otherwise. "auto" (or empty) is the even split.
std::vector<PipelineStage> split_stages(std::string_view pp_layers, int n_layer, int stages);

// "0-4,5-11" (each stage's blocks, inclusive): how runs and plans print the cut.
std::string describe_stages(const std::vector<PipelineStage>& stages);

}  // namespace memfit
