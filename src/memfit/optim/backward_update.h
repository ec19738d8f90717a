// --update-in-backward: the optimizer steps each unit of the layout (unit_ranges in
// model/param_layout.h: the embeddings, each block, the tail) as soon as the backward has
// finished its gradients, straight from the unit's buffer, so no gradient slab exists (LOMO's
// and PyTorch's optimizer-in-backward idea). A gradient store (model/grad_store.h) the backward
// writes through: the edge units (the embeddings, the tail) have a buffer each for the step
// (GPT-2's tied head writes the embedding gradient during the forward's LM head; LLaMA's
// untied head is the tail's), the blocks share one slot, zeroed as each block's backward
// starts and free again once its update is done (the update runs inside done(), before the
// next block's backward begins). The units are finished, and updated, in the backward's order:
// the tail (after the final norm's backward), blocks L-1 .. 0, the embeddings last, so the tied
// embedding/LM-head table is stepped only once both its uses have added their gradients.
// Each unit is stepped by an optimizer over the unit's range whose state is bound to the run's
// optimizer's own tensors (Optimizer::state_extents), so checkpoints, resume and the planner see
// one optimizer; a range's update is the whole layout's on its elements, so without clipping
// the weights and the state are bit for bit the ordinary step's. Clipping on the global norm
// needs every gradient first: LOMO's two passes, the first backward only summing each unit's
// squares, the second (the same forward and backward again) stepping every unit by the global
// factor, bit for bit the ordinary clipped step at the cost of a second forward and backward;
// or per-unit clipping, another algorithm (each unit scaled by min(1, clip / (||g_unit|| +
// 1e-6))), in one pass.
// Note [Update in backward] (docs/notes/update-in-backward.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "memfit/memory/pool.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/grad_store.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"

namespace memfit {

// What the step's fused updates found, for the log and the non-finite stop.
struct BackwardUpdateResult {
  // Every unit's gradients were finite (a unit that was not is left unstepped, and with global
  // clipping none is; the run stops).
  bool finite = true;
  // The sum over units (added in unit order, as the ordinary step's check adds them) of each
  // unit's squared 2-norm, before any clipping (global clipping: the measuring pass's).
  double sum_squares = 0;
};

class BackwardUpdate final : public GradStore {
 public:
  // Category::grads this store allocates for `layout`: the edge units' buffers and one block
  // slot, each rounded as the pool rounds. What the planner counts.
  static size_t grads_bytes(const ParamLayout& layout);

  BackwardUpdate(MemoryPool& pool, const ParamLayout& layout);

  // The optimizer (over the whole layout: one process) whose state the per-unit steps use, the
  // weights of record it steps (f32 master weights, or the working weights themselves) and,
  // with master weights, the working copy rounded from them in the same pass. Before the
  // first step; the tensors must outlive this store's use.
  void attach(const OptimConfig& config, Optimizer& optimizer, Tensor weights, Tensor working);
  // How a step's --clip applies (clip <= 0: none, one pass).
  enum class Clip {
    unit,    // each unit by its own norm, in one pass
    global,  // by the global norm: a measuring pass, then the stepping pass (second_pass())
  };
  // A new step's learning rate and clipping. Before its forward.
  void begin_step(float lr, float clip, Clip mode);
  // Global clipping: the measuring pass is done and finite, so the caller runs the same
  // micro-batch's forward and backward again, which steps every unit by the global factor.
  bool second_pass() const { return pass_ == Pass::step_global; }
  // After the step's backward: what the updates found. Every unit has been stepped (when
  // finite) and the optimizer's step count advanced.
  BackwardUpdateResult result() const;

  // GradStore.
  const ModelWeights& views() const override { return views_; }
  void zero() override;
  void begin_micro_batch() override;
  void enter_backward(int layer) override;
  void done(int part) override;
  const std::vector<UnitGradCheck>& unit_checks() const override { return checks_; }

 private:
  void update_unit(size_t unit, const Tensor& grads);

  const ParamLayout layout_;  // its own copy: made before the model
  std::vector<ElementRange> units_;
  Tensor edges_, slot_;
  int64_t tail_at_ = 0;
  ModelWeights views_;
  Optimizer* whole_ = nullptr;
  std::vector<std::unique_ptr<Optimizer>> unit_opts_;
  Tensor weights_, working_;
  std::vector<UnitGradCheck> checks_;
  // What the next backward does: nothing begun; step each unit (clipped by its own norm where
  // clip_ > 0); only measure (global clipping's first pass); step by factor_ (its second).
  enum class Pass { idle, step_unit, measure, step_global };
  Pass pass_ = Pass::idle;
  float lr_ = 0, clip_ = 0, factor_ = 1;
  int64_t steps_before_ = 0;
  int micro_batches_ = 0, units_done_ = 0;
};

}  // namespace memfit
