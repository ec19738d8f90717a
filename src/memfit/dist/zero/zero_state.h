// The services a rank's Transformer is built with under ZeRO and offload (model/weight_source.h's
// ModelState): stage 3's gathers and --offload-params' file source (WeightGather), the per-unit
// reduction of the gradients (UnitGrads), or a gradient store (--offload-grads). The model calls
// them through its interfaces and includes nothing from dist/; the trainer keeps the concrete
// objects it needs besides (the sums over ranks, the offloaded update's access to the weights'
// file). Note [State placement] (docs/notes/state-placement.md).
#pragma once

#include <memory>
#include <optional>

#include "memfit/dist/zero/unit_grads.h"
#include "memfit/dist/zero/weight_gather.h"
#include "memfit/model/grad_store.h"
#include "memfit/model/weight_source.h"
#include "memfit/core/element_range.h"
#include "memfit/state/state_placement.h"

namespace memfit {

// The concrete services, set when the Transformer makes them (in its constructor).
struct ZeroServices {
  WeightGather* weights = nullptr;  // stage 3, or --offload-params
  UnitGrads* grads = nullptr;       // per-unit gradients over ranks (or bf16)
};

// `master_range`, `master_in_ram`: ModelState's. `sharding` (stage 3, Note [ZeRO stage 3]): the
// working weights are this rank's shard, which must be `master_range`, and the step gathers what
// each phase reads; every rank must then run the same steps and loads. `grad_sharding` (stages
// 2-3, or 0-1 reducing every micro-batch, or bf16 gradients: Note [Sharded gradients]): the
// backward writes each unit's gradients into buffers of their own and reduces them as each ends.
// `param_file` (--offload-params, Note [NVMe offload]): the blocks' working weights in that file
// (kept by the caller, outliving the model); needs `master_in_ram` false. `grad_store`
// (--offload-grads, one process): the gradients per unit in the store, no slab. `services`, if
// given, gets the objects made (it must outlive the Transformer's constructor).
ModelState zero_model_state(std::optional<ElementRange> master_range, bool master_in_ram,
                            const ParamSharding* sharding, const GradSharding* grad_sharding,
                            const ParamOffload* param_file,
                            std::unique_ptr<GradStore> grad_store = nullptr,
                            ZeroServices* services = nullptr);

// The same from the rank's placement (Note [State placement]): its owned range and where the
// master weights live, stage 3's sharding and the file of the working weights (`params_file`,
// made by the caller where placement.params_in_file()), the per-unit reduction of the
// gradients over `comm`, or the caller's store where placement.grads_in_file().
// `steps` (--update-in-backward at stages 2-3, Note [Update in backward]): what steps each
// unit's part of this rank's shard once it is reduce-scattered.
ModelState zero_model_state(const StatePlacement& placement, dist::Communicator& comm,
                            UnitFile* params_file, std::unique_ptr<GradStore> grad_store,
                            ZeroServices* services = nullptr, UnitSteps* steps = nullptr);

}  // namespace memfit
