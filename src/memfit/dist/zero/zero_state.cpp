// A rank's ModelState under ZeRO and offload (Note [State placement]).
#include "memfit/dist/zero/zero_state.h"

#include <utility>

#include "memfit/core/error.h"

namespace memfit {

ModelState zero_model_state(std::optional<ElementRange> master_range, bool master_in_ram,
                            const ParamSharding* sharding, const GradSharding* grad_sharding,
                            const ParamOffload* param_file, std::unique_ptr<GradStore> grad_store,
                            ZeroServices* services) {
  MEMFIT_CHECK(!(grad_store && grad_sharding), "model",
               "a gradient store (--offload-grads) and per-unit reduction over ranks together");
  ModelState s = ModelState::master_shard(master_range, master_in_ram);
  if (sharding) {
    MEMFIT_CHECK(sharding->comm != nullptr && master_range.has_value() &&
                     sharding->shards.at(static_cast<size_t>(sharding->comm->rank())) ==
                         *master_range,
                 "model", "stage 3's working weights are the rank's shard, its master range");
  }
  s.params_sharded = sharding != nullptr;
  s.params_in_file = param_file != nullptr;
  if (sharding) {
    const ParamSharding shard = *sharding;
    UnitFile* file = param_file ? param_file->file : nullptr;
    s.make_weights = [shard, file, services](MemoryPool& pool, const ParamLayout& layout,
                                             const Tensor& params, DType dtype) {
      auto g = std::make_unique<WeightGather>(pool, layout, params, shard, file, dtype);
      if (services) services->weights = g.get();
      return std::unique_ptr<WeightSource>(std::move(g));
    };
  } else if (param_file) {
    const ParamOffload f = *param_file;
    s.make_weights = [f, services](MemoryPool& pool, const ParamLayout& layout, const Tensor&,
                                   DType dtype) {
      auto g = std::make_unique<WeightGather>(pool, layout, dtype, *f.file, f.prefetch_depth,
                                              f.persist_threshold);
      if (services) services->weights = g.get();
      return std::unique_ptr<WeightSource>(std::move(g));
    };
  }
  if (grad_sharding) {
    // Stages 0-1 reducing every micro-batch accumulate the sums in the whole f32 slab itself;
    // sharded gradients (stages 2-3) and bf16 ones have an accumulator of their own.
    s.grads_into_slab = grad_sharding->whole && grad_sharding->dtype == DType::f32;
    const GradSharding g = *grad_sharding;
    s.make_grads = [g, services](MemoryPool& pool, const ParamLayout& layout, const Tensor& slab) {
      auto u = std::make_unique<UnitGrads>(pool, layout, g, slab);
      if (services) services->grads = u.get();
      return std::unique_ptr<GradStore>(std::move(u));
    };
  } else if (grad_store) {
    // std::function is copyable: the store rides in a shared holder, taken out once.
    auto held = std::make_shared<std::unique_ptr<GradStore>>(std::move(grad_store));
    s.make_grads = [held](MemoryPool&, const ParamLayout&, const Tensor&) {
      MEMFIT_CHECK(*held != nullptr, "model", "the gradient store was handed to a model already");
      return std::move(*held);
    };
  }
  return s;
}

ModelState zero_model_state(const StatePlacement& placement, dist::Communicator& comm,
                            UnitFile* params_file, std::unique_ptr<GradStore> grad_store,
                            ZeroServices* services, UnitSteps* steps) {
  MEMFIT_CHECK(placement.world() == comm.size() && placement.rank() == comm.rank(), "model",
               "the placement of rank {} of {} on rank {} of {}", placement.rank(),
               placement.world(), comm.rank(), comm.size());
  MEMFIT_CHECK(placement.params_in_file() == (params_file != nullptr) &&
                   (placement.grads_in_file() ||
                    (placement.grads_in_backward() && !placement.grads_per_unit())) ==
                       (grad_store != nullptr),
               "model", "the working weights' file and the gradient store are the placement's");
  std::optional<ParamSharding> sharding;
  if (placement.params_gathered())
    sharding = ParamSharding{&comm, placement.shards(), placement.prefetch_depth(),
                             placement.persist_threshold()};
  std::optional<ParamOffload> file;
  if (params_file)
    file = ParamOffload{params_file, placement.prefetch_depth(), placement.persist_threshold()};
  MEMFIT_CHECK((steps != nullptr) == (placement.grads_in_backward() && placement.grads_per_unit()),
               "model", "--update-in-backward's steps are the per-unit reduction's at stages 2-3");
  std::optional<GradSharding> grads;
  if (placement.grads_per_unit())
    grads = GradSharding{&comm, placement.grad_shards(), placement.bucket_bytes(),
                         placement.grads_whole(), placement.grad_dtype(), steps};
  // Stage 3's working weights are the rank's shard, the model's master range, even where
  // nothing else is sharded (LoRA's frozen base: no master weights, no optimizer over it).
  const std::optional<ElementRange> range =
      placement.params_gathered() ? std::optional<ElementRange>(placement.my_shard())
                                  : placement.owned();
  ModelState state =
      zero_model_state(range, /*master_in_ram=*/!placement.optimizer_in_file(),
                       sharding ? &*sharding : nullptr, grads ? &*grads : nullptr,
                       file ? &*file : nullptr, std::move(grad_store), services);
  state.params_fp8 = placement.params_fp8();  // Note [FP8], "Storage"
  return state;
}

}  // namespace memfit
