// Where this rank's model state lives, decided once per run and rank: the working weights, the
// FP32 master weights, the gradients and the optimizer state, each whole in RAM, a shard in RAM,
// or in a file on disk, with its element range, and how the working weights are gathered and
// the gradients reduced. The trainer builds the model and the optimizer from it, the planner
// counts its bytes from it, a save writes what it says each rank owns: none of them decodes a
// ZeRO stage. Note [State placement] (docs/notes/state-placement.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optim_config.h"
#include "memfit/core/element_range.h"
#include "memfit/state/state_sharding.h"

namespace memfit {

// The rank's coordinates in the job. Today the data-parallel rank and the number of such ranks;
// a tensor- or pipeline-parallel rank would add its coordinates here.
struct RankCoords {
  int rank = 0;
  int world = 1;
};

// What a run asks of its state, as the options say it (RunSpec::state_options fills it).
struct StateOptions {
  // --zero as given: what each rank shards over several ranks (Note [ZeRO]). With one rank
  // every stage places the state as stage 0.
  int zero = 0;
  DType working_dtype = DType::f32;  // half_dtype(precision): the working weights' type
  bool master_weights = false;       // FP32 master weights are kept (a half precision's)
  // --offload-optimizer, --offload-params, --offload-grads nvme, and --offload-dir.
  bool offload_optimizer = false, offload_params = false, offload_grads = false;
  std::string offload_dir;
  // Blocks gathered (or read from their file) ahead of the one computing, and the block size
  // (elements) under which a block is kept whole (Note [ZeRO stage 3]).
  int prefetch_depth = 1;
  int64_t persist_threshold = 0;
  // --sync-every-micro-batch, --grad-dtype and the bucket size of the gradients' exchange.
  bool sync_every_micro_batch = false;
  DType grad_dtype = DType::f32;
  size_t bucket_bytes = 0;
  // --update-in-backward (one process, or stages 2-3): each unit's gradients live only in a
  // unit buffer and are stepped as the backward ends the unit (Note [Update in backward]).
  bool update_in_backward = false;
  // LoRA's frozen base (Note [LoRA], "ZeRO and offload"): no gradients and no optimizer over
  // the base, so nothing of theirs is sharded; stage 3 shards and gathers the working weights
  // alone (read only), and the adapters' state stays whole on every rank.
  bool frozen_base = false;
  // --precision fp8: the blocks' linear working weights are stored as FP8 where the placement
  // allows it (params_fp8).
  bool fp8_weights = false;
};

// Where one kind of state lives on a rank.
enum class Residence {
  none,   // not kept (master weights where the precision has none)
  whole,  // the whole layout in RAM
  shard,  // this rank's shard in RAM
  file,   // in a file on disk (this rank's range of it; RAM holds at most a ring)
};
const char* residence_name(Residence r);

struct StateSlice {
  Residence where = Residence::whole;
  // The layout elements this rank holds: the whole layout, or its shard. (Empty for none.)
  ElementRange range;
};

class StatePlacement {
 public:
  // `optim` cuts the shards (shard_ranges: where its state allows). Over several ranks the
  // shards are computed once here; of_rank() reuses them.
  StatePlacement(const ParamLayout& layout, const OptimConfig& optim, const StateOptions& options,
                 RankCoords coords);

  // The same run's placement on rank `rank` (the shards are not cut again).
  StatePlacement of_rank(int rank) const;

  // Whether the gradients are reduced per unit as each unit's backward ends (UnitGrads: Note
  // [Sharded gradients]): stages 2-3, or stages 0-1 under --sync-every-micro-batch, over several
  // ranks; bf16 gradients at every stage and in one process; never with --offload-grads, whose
  // store keeps them per unit itself. Needs no layout (RunSpec::unit_grads asks it).
  static bool grads_per_unit(const StateOptions& options, int world);

  // Questions a run's options answer without a layout, for the code that decides before any
  // placement is built (RunSpec::check, the search) or counts without one (the collectives).
  // What each rank shards over `world` ranks: the one place --zero is decoded.
  static StateSharding sharding(const StateOptions& options, int world);
  // The optimizer state may go to files (--offload-optimizer): in one process, or where each
  // rank owns a shard of it; otherwise every rank would write the whole state.
  static bool allows_optimizer_offload(const StateOptions& options, int world);
  // The working weights may go to a file (--offload-params): in one process, or where each
  // rank holds a shard of them (gathered per unit); otherwise every rank would write them whole.
  static bool allows_params_offload(const StateOptions& options, int world);
  // --update-in-backward: in one process, or where each unit's gradients are reduce-scattered
  // as its backward ends (sharded gradients, not the whole-slab sync of
  // --sync-every-micro-batch), so the rank can step its part of the unit at once.
  static bool allows_update_in_backward(const StateOptions& options, int world);

  const RankCoords& coords() const { return coords_; }
  int rank() const { return coords_.rank; }
  int world() const { return coords_.world; }
  // The ZeRO stage in effect: --zero over several ranks, 0 with one. Named for logs, the
  // profile and the checkpoint's index only; decisions read the questions below.
  int stage() const { return stage_; }
  // What this rank keeps only its shard of (sharding(options(), world())).
  const StateSharding& sharding() const { return sharding_; }
  const StateOptions& options() const { return options_; }

  ElementRange whole() const { return whole_; }
  // One range per rank, in rank order, tiling the layout (shard_ranges); {whole()} with one rank.
  const std::vector<ElementRange>& shards() const { return shards_; }
  // This rank's shard, whatever the stage (whole() with one rank).
  ElementRange my_shard() const { return shards_.at(static_cast<size_t>(coords_.rank)); }
  // The elements whose master weights and optimizer state this rank owns, where they are a
  // shard (from stage 1 on); none where every rank holds the whole.
  std::optional<ElementRange> owned() const;
  // owned(), or the whole layout.
  ElementRange owned_range() const { return owned().value_or(whole_); }

  // The four kinds of state.
  const StateSlice& params() const { return params_; }
  const StateSlice& master() const { return master_; }
  const StateSlice& grads() const { return grads_; }
  const StateSlice& optimizer() const { return optimizer_; }

  // Working weights: this rank's shard alone, each unit gathered from the ranks as the step
  // needs it (stage 3, Note [ZeRO stage 3]).
  bool params_gathered() const { return params_gathered_; }
  // --offload-params: the blocks' working weights in a file (at stage 3 the rank's part of
  // each), read before the phases that need them; RAM holds the persistent units.
  bool params_in_file() const { return options_.offload_params; }
  // The range the working weights' file holds: the rank's shard when gathered, else the whole.
  std::optional<ElementRange> params_file_range() const;
  int prefetch_depth() const { return options_.prefetch_depth; }
  int64_t persist_threshold() const { return options_.persist_threshold; }

  // --precision fp8's working weights stored as FP8 (Note [FP8], "Storage"): the blocks' linear
  // weights one byte each (E4M3 codes, a scale per matrix), encoded from the master weights
  // after each update. Where the working weights are whole in RAM and the master weights in RAM
  // (whole, or this rank's shard at ZeRO stages 1-2, whose owners encode their ranges with the
  // scales agreed over the ranks and all-gather the codes: dist/zero/fp8_publish.h); elsewhere
  // the working weights are bf16 as in --precision bf16 and the linears cast them at each use
  // (fp8_fallback() says why).
  bool params_fp8() const {
    return options_.fp8_weights && params_.where == Residence::whole &&
           (master_.where == Residence::whole || master_.where == Residence::shard);
  }
  // Why --precision fp8 keeps bf16 working weights here (empty where params_fp8(), or not fp8):
  // what the start-up line says.
  std::string fp8_fallback() const;

  // Master weights and optimizer state in files (--offload-optimizer), in offload_dir().
  bool optimizer_in_file() const { return options_.offload_optimizer; }
  // Where this rank's offload files go: --offload-dir, or its rank-<r> subdirectory over
  // several ranks (so ranks sharing one never collide).
  std::filesystem::path offload_dir() const;

  // Gradients: reduced per unit (grads_per_unit); the accumulator whole (every rank sums every
  // gradient: stages 0-1) or this rank's shard (stages 2-3); in a file (--offload-grads).
  bool grads_per_unit() const { return grads_per_unit_; }
  bool grads_whole() const { return grads_whole_; }
  bool grads_in_file() const { return options_.offload_grads; }
  // --update-in-backward: the gradients are a unit buffer each, consumed by the update that
  // runs as each unit's backward ends (Note [Update in backward]): in one process the store's
  // (optim/backward_update.h), at stages 2-3 the per-unit reduction's, no accumulator.
  bool grads_in_backward() const { return options_.update_in_backward; }
  // Per-unit gradients summed into an accumulator of their own (the shard's, or bf16), not
  // into the whole f32 slab.
  bool grads_own_accumulator() const {
    return grads_per_unit_ && !options_.update_in_backward &&
           (!grads_whole_ || options_.grad_dtype != DType::f32);
  }
  DType grad_dtype() const { return options_.grad_dtype; }
  size_t bucket_bytes() const { return options_.bucket_bytes; }
  // The ranges a per-unit reduction scatters into: shards() over several ranks, else {whole()}.
  const std::vector<ElementRange>& grad_shards() const { return shards_; }

  // A save writes ZeRO's shard files (each rank its owned range of the weights of record and of
  // the optimizer state) and no model.safetensors: from stage 1 on.
  bool sharded_save() const { return owned().has_value(); }

 private:
  StatePlacement() = default;
  void place();

  StateOptions options_;
  RankCoords coords_;
  int stage_ = 0;
  StateSharding sharding_;
  ElementRange whole_;
  std::vector<ElementRange> shards_;
  StateSlice params_, master_, grads_, optimizer_;
  bool params_gathered_ = false, grads_per_unit_ = false, grads_whole_ = true;
};

}  // namespace memfit
