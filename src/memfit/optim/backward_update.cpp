// The one-process store of --update-in-backward (backward_update.h; Note [Update in backward],
// docs/notes/update-in-backward.md).
#include "memfit/optim/backward_update.h"

#include <algorithm>
#include <cmath>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/fill.h"

namespace memfit {

namespace {

struct Sizes {
  std::vector<ElementRange> units;
  // tied: GPT-2's tied head adds the embedding table's gradient during the forward, so the
  // embeddings keep a buffer of their own for the step; else they share the block slot.
  bool tied = false;
  int64_t edge_elements = 0, slot_elements = 0;
};

Sizes sizes(const ParamLayout& layout) {
  Sizes s;
  s.units = unit_ranges(layout);
  MEMFIT_CHECK(s.units.size() >= 3, "optim",
               "--update-in-backward needs the embeddings, at least one block and the tail ({} "
               "units)",
               s.units.size());
  s.tied = std::none_of(layout.params().begin(), layout.params().end(),
                        [](const ParamInfo& p) { return p.role == ParamRole::lm_head; });
  // The tail's gradients are written from the forward's LM head to the tail's step, before the
  // first block's backward takes the slot; an untied table's in the embedding backward, after
  // the last block's step: each in turn in the slot.
  s.slot_elements = s.units.back().size();
  if (s.tied) s.edge_elements = s.units.front().size();
  else s.slot_elements = std::max(s.slot_elements, s.units.front().size());
  for (size_t u = 1; u + 1 < s.units.size(); ++u)
    s.slot_elements = std::max(s.slot_elements, s.units[u].size());
  return s;
}

size_t f32_bytes(int64_t n) {
  return MemoryPool::round_up(static_cast<size_t>(std::max<int64_t>(1, n)) * sizeof(float));
}

}  // namespace

size_t BackwardUpdate::grads_bytes(const ParamLayout& layout) {
  const Sizes s = sizes(layout);
  return (s.tied ? f32_bytes(s.edge_elements) : 0) + f32_bytes(s.slot_elements);
}

BackwardUpdate::BackwardUpdate(MemoryPool& pool, const ParamLayout& layout)
    : layout_(layout), steps_(layout, whole_range(layout)) {
  const Sizes s = sizes(layout_);
  units_ = s.units;
  tied_ = s.tied;
  if (tied_)
    edges_ = Tensor::empty(pool, {s.edge_elements}, DType::f32, Category::grads, "grads.edges");
  slot_ = Tensor::empty(pool, {s.slot_elements}, DType::f32, Category::grads, "grads.block");
  // Untied, the embeddings' views start in the slot too (nothing writes them before their
  // backward, which binds them again: enter_embedding_backward).
  layout_.bind(views_, embeddings(), units_.front());
  layout_.bind(views_, tail(), units_.back());
}

Tensor BackwardUpdate::embeddings() const {
  return (tied_ ? edges_ : slot_).view(0, {units_.front().size()});
}

Tensor BackwardUpdate::tail() const { return slot_.view(0, {units_.back().size()}); }

void BackwardUpdate::begin_micro_batch() {
  steps_.begin_micro_batch();
  // The forward's LM head adds the tail's head gradient (and a tied table's) from here.
  Tensor t = tail();
  kernels::zero(t);
  layout_.bind(views_, t, units_.back());
  if (tied_) kernels::zero(edges_);
}

void BackwardUpdate::enter_backward(int layer) {
  // The previous unit's step (the tail's, or the block above's) finished inside its done():
  // the slot is free.
  kernels::zero(slot_);
  const ElementRange unit = units_[static_cast<size_t>(1 + layer)];
  layout_.bind(views_, slot_.view(0, {unit.size()}), unit);
}

void BackwardUpdate::enter_embedding_backward() {
  if (tied_) return;  // its buffer has the head's part since the forward
  // Block 0's step is done: the untied table's gradient takes the slot.
  Tensor e = embeddings();
  kernels::zero(e);
  layout_.bind(views_, e, units_.front());
}

void BackwardUpdate::done(int part) {
  const int n_layer = static_cast<int>(units_.size()) - 2;
  if (part == n_layer) {
    steps_.unit_done(units_.size() - 1, tail());
  } else if (part >= 0) {
    const size_t u = static_cast<size_t>(1 + part);
    steps_.unit_done(u, slot_.view(0, {units_[u].size()}));
  } else {
    steps_.unit_done(0, embeddings());
    steps_.end_backward();
  }
}

}  // namespace memfit
