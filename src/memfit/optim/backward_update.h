// --update-in-backward in one process: the gradient store (model/grad_store.h) whose units are
// stepped as the backward finishes them (optim/unit_steps.h), so no gradient slab exists (LOMO's
// and PyTorch's optimizer-in-backward idea). Every unit takes one slot in turn, zeroed as its
// gradients start and free again once its step is done (the step runs inside done(), before the
// next unit's gradients begin): the tail (its head's gradient added by the forward's LM head,
// stepped after the final norm's backward), each block, then an untied embedding table (its
// backward runs after block 0's step). GPT-2's tied table alone has a buffer for the step: the
// forward's LM head adds to it before any block's backward. The units are finished, and stepped, in the backward's order:
// the tail (after the final norm's backward), blocks L-1 .. 0, the embeddings last, so the tied
// embedding/LM-head table is stepped only once both its uses have added their gradients.
// A pipeline stage's store holds its own units alone (model/unit_map.h): its blocks, and the
// tail or the embeddings where the stage has them (Note [Update in backward], "Under --pp").
// Note [Update in backward] (docs/notes/update-in-backward.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "memfit/memory/pool.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/grad_store.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/unit_map.h"
#include "memfit/optim/unit_steps.h"

namespace memfit {

class BackwardUpdate final : public GradStore {
 public:
  // Category::grads this store allocates for `layout`: the edge units' buffers and one block
  // slot, each rounded as the pool rounds. What the planner counts.
  static size_t grads_bytes(const ParamLayout& layout);

  BackwardUpdate(MemoryPool& pool, const ParamLayout& layout);

  // The steps (over the whole layout): attach, begin_step, second_pass, result.
  UnitSteps& steps() { return steps_; }

  // GradStore.
  const ModelWeights& views() const override { return views_; }
  void zero() override {}
  void begin_micro_batch() override;
  void enter_backward(int layer) override;
  void enter_embedding_backward() override;
  void done(int part) override;
  const std::vector<UnitGradCheck>& unit_checks() const override { return steps_.checks(); }

 private:
  const ParamLayout layout_;  // its own copy: made before the model
  // Which unit is which (a pipeline stage's layout holds some of them: model/unit_map.h).
  UnitMap map_;
  const ElementRange& unit(int u) const { return map_.units[static_cast<size_t>(u)]; }
  // The tail's gradients, then each block's in turn, then (untied) the embeddings'.
  Tensor embeddings() const;
  Tensor tail() const;

  bool tied_ = false;
  Tensor edges_, slot_;  // edges_: a tied table's buffer for the step (GPT-2)
  ModelWeights views_;
  UnitSteps steps_;
};

}  // namespace memfit
