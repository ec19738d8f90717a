// The seam between the model and state that lives elsewhere than the model's own slabs (Note
// [State placement], docs/notes/state-placement.md): the working weights the step reads when they
// are not one whole slab in RAM (WeightSource: ZeRO stage 3's gathers, the blocks read from a
// file), and the services the Transformer is built with (ModelState). The model calls these
// interfaces at the points of its step; what implements them (dist/zero/, offload/) and how the
// ranks exchange is not the model's business, so model/ includes nothing from dist/.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/grad_store.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/step_schedule.h"
#include "memfit/core/element_range.h"

namespace memfit {

// The working weights the step reads, unit by unit, when the model does not hold them whole:
// dist/zero/weight_gather.h (ZeRO stage 3's gathers, and --offload-params' file source).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The views the step reads: the persistent units always, a block once its phase is entered.
  virtual const ModelWeights& weights() const = 0;
  // The phases of the step plan the model runs from now on (Transformer::reserve).
  virtual void set_phases(const std::vector<Phase>& phases) = 0;
  // The step entered phase `phase` of the plan (0: a new micro-batch).
  virtual void enter(int phase) = 0;
  // The working weights changed (update, load, initialisation): every rank at the same point.
  virtual void refresh() = 0;
  // The bytes gathered since the last call.
  virtual int64_t take_gathered_bytes() = 0;
  // Whether the blocks live in a file (--offload-params): the model then holds no working slab
  // and sets the weights through store_from.
  virtual bool from_file() const = 0;
  // File source: the longest unit part this rank stores, and the working copy from `fill`
  // through `piece` (at most largest_part() f32 elements).
  virtual int64_t largest_part() const = 0;
  virtual void store_from(const std::function<void(int64_t, int64_t, float*)>& fill,
                          Tensor& piece) = 0;
  // Called on the views after every (re)binding of a unit's weights (a block gathered or read,
  // the persistent units), and once now: LoRA binds its adapters into them (Note [LoRA]).
  using BindHook = std::function<void(ModelWeights&)>;
  virtual void set_bind_hook(BindHook hook) = 0;
};

// What the Transformer is told of where its state lives, with the services that keep the parts
// it does not hold (made by dist/zero/zero_state.h from the run's placement; the default is one
// process with everything in RAM).
struct ModelState {
  // The master weights of these elements only (a ZeRO shard from stage 1 on, Note [ZeRO]); the
  // whole layout when absent. `master_in_ram` false: they live elsewhere (an offload file), and
  // the caller keeps them.
  std::optional<ElementRange> master_range;
  bool master_in_ram = true;
  // The working weights: the whole layout in RAM (no source); master_range alone, the source
  // gathering what each phase reads (`params_sharded`, stage 3); or none in RAM (`params_in_file`,
  // the source reads them). Made once the model has its layout and its working shard.
  bool params_sharded = false;
  bool params_in_file = false;
  // A quantized base (--base-dtype nf4 or int8; Note [NF4 weights], "QLoRA", Note [Int8
  // weights]): the blocks' linear weights live quantized in this format in one buffer
  // (Category::params, "base.nf4" or "base.int8"; model/quant_base.h) and the working slab
  // holds every other parameter alone (ParamLayout::compact_offsets). One process, in RAM, no
  // master weights; the base is then frozen (Transformer::add_lora with its LoRA options).
  std::optional<kernels::WeightQuant> base_quant;
  // --precision fp8 with its working weights stored (StatePlacement::params_fp8; Note [FP8],
  // "Storage"): the blocks' linear weights live as E4M3 codes with a scale per matrix in one
  // buffer (Category::params, "params.fp8"; model/fp8_weights.h), encoded from the master
  // weights, and the working slab holds every other parameter alone (compact_offsets). The
  // working weights whole in RAM and the master weights in RAM, whole or this rank's shard (one
  // process, ZeRO stages 0-2, no offload; model/fp8_shard.h).
  bool params_fp8 = false;
  // `params`: the working shard the model allocated (undefined in a file), of `dtype`.
  std::function<std::unique_ptr<WeightSource>(MemoryPool& pool, const ParamLayout& layout,
                                              const Tensor& params, DType dtype)>
      make_weights;
  // The gradients per unit (model/grad_store.h): `grads_into_slab`, the store sums into the
  // model's whole f32 slab (stages 0-1 reducing every micro-batch), which it is made with.
  bool grads_into_slab = false;
  std::function<std::unique_ptr<GradStore>(MemoryPool& pool, const ParamLayout& layout,
                                           const Tensor& slab)>
      make_grads;

  // Master weights over `range` alone (a shard), in RAM or not; nothing else moved.
  static ModelState master_shard(std::optional<ElementRange> range, bool in_ram = true) {
    ModelState s;
    s.master_range = range;
    s.master_in_ram = in_ram;
    return s;
  }
};

}  // namespace memfit
