// The one-process store of --update-in-backward (backward_update.h; Note [Update in backward],
// docs/notes/update-in-backward.md).
#include "memfit/optim/backward_update.h"

#include <algorithm>
#include <cmath>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/fill.h"
#include "memfit/model/unit_map.h"

namespace memfit {

namespace {

struct Sizes {
  UnitMap map;
  // tied: GPT-2's tied head adds the embedding table's gradient during the forward, so the
  // embeddings keep a buffer of their own for the step; else they share the block slot.
  bool tied = false;
  int64_t edge_elements = 0, slot_elements = 0;
};

Sizes sizes(const ParamLayout& layout) {
  Sizes s;
  s.map = unit_map(layout);
  // A pipeline stage's layout (Note [Update in backward], "Under --pp") holds its blocks, and
  // the embeddings or the tail where it has them; a tied model's stages are refused
  // (RunSpec::check_update_in_backward: the table's two parts are summed after the backward).
  MEMFIT_CHECK(s.map.blocks >= 1 && s.map.copy < 0, "optim",
               "--update-in-backward needs at least one block and no tied table's copy ({} "
               "units, {} blocks)",
               s.map.units.size(), s.map.blocks);
  const bool whole = s.map.embeddings >= 0 && s.map.tail >= 0;
  s.tied = whole && std::none_of(layout.params().begin(), layout.params().end(),
                                 [](const ParamInfo& p) { return p.role == ParamRole::lm_head; });
  // The tail's gradients are written from the forward's LM head to the tail's step, before the
  // first block's backward takes the slot; an untied table's in the embedding backward, after
  // the last block's step: each in turn in the slot.
  for (size_t u = 0; u < s.map.units.size(); ++u) {
    if (s.tied && static_cast<int>(u) == s.map.embeddings)
      s.edge_elements = s.map.units[u].size();
    else
      s.slot_elements = std::max(s.slot_elements, s.map.units[u].size());
  }
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
  map_ = s.map;
  tied_ = s.tied;
  if (tied_)
    edges_ = Tensor::empty(pool, {s.edge_elements}, DType::f32, Category::grads, "grads.edges");
  slot_ = Tensor::empty(pool, {s.slot_elements}, DType::f32, Category::grads, "grads.block");
  // Untied, the embeddings' views start in the slot too (nothing writes them before their
  // backward, which binds them again: enter_embedding_backward).
  if (map_.embeddings >= 0) layout_.bind(views_, embeddings(), unit(map_.embeddings));
  if (map_.tail >= 0) layout_.bind(views_, tail(), unit(map_.tail));
}

Tensor BackwardUpdate::embeddings() const {
  return (tied_ ? edges_ : slot_).view(0, {unit(map_.embeddings).size()});
}

Tensor BackwardUpdate::tail() const { return slot_.view(0, {unit(map_.tail).size()}); }

void BackwardUpdate::begin_micro_batch() {
  steps_.begin_micro_batch();
  // The forward's LM head adds the tail's head gradient (and a tied table's) from here.
  if (map_.tail >= 0) {
    Tensor t = tail();
    kernels::zero(t);
    layout_.bind(views_, t, unit(map_.tail));
  }
  if (tied_) kernels::zero(edges_);
}

void BackwardUpdate::enter_backward(int layer) {
  // The previous unit's step (the tail's, or the block above's) finished inside its done():
  // the slot is free.
  kernels::zero(slot_);
  const ElementRange u = map_.units[map_.block_unit(layer)];
  layout_.bind(views_, slot_.view(0, {u.size()}), u);
}

void BackwardUpdate::enter_embedding_backward() {
  // (A pipeline stage after the first runs the phase to copy its input's gradient out: it
  // holds no table.)
  if (tied_ || map_.embeddings < 0) return;  // tied: its buffer has the head's part already
  // Block 0's step is done: the untied table's gradient takes the slot.
  Tensor e = embeddings();
  kernels::zero(e);
  layout_.bind(views_, e, unit(map_.embeddings));
}

void BackwardUpdate::done(int part) {
  // The part: -1 the embeddings (a pipeline stage after the first reports it at the end of its
  // backward too), a block of the layout, or else the tail (reported as n_layer).
  if (part < 0) {
    if (map_.embeddings >= 0)
      steps_.unit_done(static_cast<size_t>(map_.embeddings), embeddings());
    steps_.end_backward();
  } else if (map_.has_block(part)) {
    const size_t u = map_.block_unit(part);
    steps_.unit_done(u, slot_.view(0, {map_.units[u].size()}));
  } else {
    MEMFIT_CHECK(map_.tail >= 0, "optim",
                 "the backward finished part {}, which this layout does not hold (blocks {} to "
                 "{}, no tail)",
                 part, map_.first_layer, map_.first_layer + map_.blocks - 1);
    steps_.unit_done(static_cast<size_t>(map_.tail), tail());
  }
}

}  // namespace memfit
