// The placement of a rank's model state (Note [State placement], docs/notes/state-placement.md):
// the one place a ZeRO stage is decoded.
#include "memfit/state/state_placement.h"

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/state/shard.h"

namespace memfit {

const char* residence_name(Residence r) {
  switch (r) {
    case Residence::none: return "none";
    case Residence::whole: return "whole";
    case Residence::shard: return "shard";
    case Residence::file: return "file";
  }
  return "?";
}

StateSharding StatePlacement::sharding(const StateOptions& o, int world) {
  // Note [ZeRO]: with one rank every stage is stage 0. Stage 1 shards the master weights and
  // the optimizer state, stage 2 the gradients' sums too, stage 3 the working weights too.
  const int stage = world > 1 ? o.zero : 0;
  // A frozen base (LoRA) has neither gradients nor optimizer state to shard.
  if (o.frozen_base) return {.optimizer = false, .grads = false, .params = stage == 3};
  return {.optimizer = stage >= 1, .grads = stage >= 2, .params = stage == 3};
}

bool StatePlacement::allows_optimizer_offload(const StateOptions& o, int world) {
  return world == 1 || sharding(o, world).optimizer;
}

bool StatePlacement::allows_params_offload(const StateOptions& o, int world) {
  return world == 1 || sharding(o, world).params;
}

bool StatePlacement::allows_update_in_backward(const StateOptions& o, int world) {
  return world == 1 || (sharding(o, world).grads && !o.sync_every_micro_batch);
}

bool StatePlacement::grads_per_unit(const StateOptions& o, int world) {
  return !o.offload_grads && !(o.update_in_backward && world == 1) &&
         (o.grad_dtype != DType::f32 || sharding(o, world).grads ||
          (world > 1 && o.sync_every_micro_batch));
}

StatePlacement::StatePlacement(const ParamLayout& layout, const OptimConfig& optim,
                               const StateOptions& options, RankCoords coords)
    : options_(options), coords_(coords), whole_{0, layout.total()} {
  MEMFIT_CHECK(coords.world >= 1 && coords.rank >= 0 && coords.rank < coords.world, "placement",
               "rank {} of a world of {}", coords.rank, coords.world);
  MEMFIT_CHECK(options.zero >= 0 && options.zero <= 3, "placement",
               "ZeRO stage {}: must be 0, 1, 2 or 3", options.zero);
  // One rank: the whole layout is its one shard, without asking the optimizer for cuts.
  shards_ = coords.world > 1 ? shard_ranges(layout, optim, coords.world)
                             : std::vector<ElementRange>{whole_};
  place();
}

StatePlacement StatePlacement::of_rank(int rank) const {
  MEMFIT_CHECK(rank >= 0 && rank < coords_.world, "placement", "rank {} of a world of {}", rank,
               coords_.world);
  StatePlacement p;
  p.options_ = options_;
  p.coords_ = {rank, coords_.world};
  p.whole_ = whole_;
  p.shards_ = shards_;
  p.place();
  return p;
}

void StatePlacement::place() {
  stage_ = coords_.world > 1 ? options_.zero : 0;  // for logs (stage())
  sharding_ = sharding(options_, coords_.world);
  const std::optional<ElementRange> mine = owned();
  const ElementRange own = mine.value_or(whole_);
  const Residence in_ram = mine ? Residence::shard : Residence::whole;

  params_gathered_ = sharding_.params;
  if (options_.offload_params)
    params_ = {Residence::file, params_file_range().value_or(whole_)};
  else
    params_ = params_gathered_ ? StateSlice{Residence::shard, my_shard()}
                               : StateSlice{Residence::whole, whole_};

  if (!options_.master_weights)
    master_ = {Residence::none, {}};
  else
    master_ = {options_.offload_optimizer ? Residence::file : in_ram, own};
  optimizer_ = {options_.offload_optimizer ? Residence::file : in_ram, own};

  grads_per_unit_ = grads_per_unit(options_, coords_.world);
  grads_whole_ = !sharding_.grads;
  if (options_.offload_grads)
    grads_ = {Residence::file, whole_};
  else if (grads_per_unit_ && !grads_whole_)
    grads_ = {Residence::shard, my_shard()};
  else
    grads_ = {Residence::whole, whole_};
}

std::optional<ElementRange> StatePlacement::owned() const {
  if (sharding_.optimizer) return my_shard();
  return std::nullopt;
}

std::optional<ElementRange> StatePlacement::params_file_range() const {
  if (params_gathered_) return my_shard();
  return std::nullopt;
}

std::string StatePlacement::fp8_fallback() const {
  if (!options_.fp8_weights || params_fp8()) return "";
  if (options_.offload_params)
    return "--offload-params writes the working weights to their file as bf16 units";
  if (params_gathered_) return "ZeRO stage 3 shards and gathers the working weights as bf16 units";
  if (options_.offload_optimizer)
    return "--offload-optimizer streams the master weights through a ring and writes bf16 "
           "working ranges";
  return "the master weights are not kept";
}

std::filesystem::path StatePlacement::offload_dir() const {
  const std::filesystem::path dir(options_.offload_dir);
  return coords_.world > 1 ? dir / fmt::format("rank-{}", coords_.rank) : dir;
}

}  // namespace memfit
