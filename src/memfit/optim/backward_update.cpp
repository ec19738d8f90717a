// The one-process store of --update-in-backward (backward_update.h; Note [Update in backward],
// docs/notes/update-in-backward.md).
#include "memfit/optim/backward_update.h"

#include <algorithm>
#include <cmath>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/fill.h"

namespace memfit {

namespace {

// The tail starts 64-byte aligned in the edges' buffer: the embeddings rounded to 16 floats.
constexpr int64_t kGranule = 16;
int64_t granules(int64_t n) { return (n + kGranule - 1) / kGranule * kGranule; }

struct Sizes {
  std::vector<ElementRange> units;
  int64_t tail_at = 0, edge_elements = 0, slot_elements = 0;
};

Sizes sizes(const ParamLayout& layout) {
  Sizes s;
  s.units = unit_ranges(layout);
  MEMFIT_CHECK(s.units.size() >= 3, "optim",
               "--update-in-backward needs the embeddings, at least one block and the tail ({} "
               "units)",
               s.units.size());
  s.tail_at = granules(s.units.front().size());
  s.edge_elements = s.tail_at + s.units.back().size();
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
  return f32_bytes(s.edge_elements) + f32_bytes(s.slot_elements);
}

BackwardUpdate::BackwardUpdate(MemoryPool& pool, const ParamLayout& layout)
    : layout_(layout), steps_(layout, whole_range(layout)) {
  const Sizes s = sizes(layout_);
  units_ = s.units;
  tail_at_ = s.tail_at;
  edges_ = Tensor::empty(pool, {s.edge_elements}, DType::f32, Category::grads, "grads.edges");
  slot_ = Tensor::empty(pool, {s.slot_elements}, DType::f32, Category::grads, "grads.block");
  layout_.bind(views_, edges_.view(0, {units_.front().size()}), units_.front());
  layout_.bind(views_, edges_.view(tail_at_, {units_.back().size()}), units_.back());
}

void BackwardUpdate::begin_micro_batch() {
  steps_.begin_micro_batch();
  kernels::zero(edges_);
}

void BackwardUpdate::enter_backward(int layer) {
  // The previous block's step finished inside its done(): the slot is free.
  kernels::zero(slot_);
  const ElementRange unit = units_[static_cast<size_t>(1 + layer)];
  layout_.bind(views_, slot_.view(0, {unit.size()}), unit);
}

void BackwardUpdate::done(int part) {
  const int n_layer = static_cast<int>(units_.size()) - 2;
  if (part == n_layer) {
    steps_.unit_done(units_.size() - 1, edges_.view(tail_at_, {units_.back().size()}));
  } else if (part >= 0) {
    const size_t u = static_cast<size_t>(1 + part);
    steps_.unit_done(u, slot_.view(0, {units_[u].size()}));
  } else {
    steps_.unit_done(0, edges_.view(0, {units_.front().size()}));
    steps_.end_backward();
  }
}

}  // namespace memfit
