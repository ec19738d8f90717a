// The optimizer stepped unit by unit inside the backward (backward_update.h; Note [Update in
// backward], docs/notes/update-in-backward.md).
#include "memfit/optim/backward_update.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/fill.h"
#include "memfit/kernels/cpu/residual.h"

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

BackwardUpdate::BackwardUpdate(MemoryPool& pool, const ParamLayout& layout) : layout_(layout) {
  const Sizes s = sizes(layout_);
  units_ = s.units;
  tail_at_ = s.tail_at;
  edges_ = Tensor::empty(pool, {s.edge_elements}, DType::f32, Category::grads, "grads.edges");
  slot_ = Tensor::empty(pool, {s.slot_elements}, DType::f32, Category::grads, "grads.block");
  layout_.bind(views_, edges_.view(0, {units_.front().size()}), units_.front());
  layout_.bind(views_, edges_.view(tail_at_, {units_.back().size()}), units_.back());
  checks_.resize(units_.size());
}

void BackwardUpdate::attach(const OptimConfig& config, Optimizer& optimizer, Tensor weights,
                            Tensor working) {
  const ElementRange whole = whole_range(layout_);
  MEMFIT_CHECK(optimizer.range() == whole && weights.numel() == whole.size() &&
                   (!working.defined() || working.numel() == whole.size()),
               "optim",
               "--update-in-backward steps the whole layout in one process: an optimizer over "
               "[{}, {}) and weights of {} elements for a layout of {}",
               optimizer.range().begin, optimizer.range().end, weights.numel(), whole.size());
  whole_ = &optimizer;
  weights_ = std::move(weights);
  working_ = std::move(working);
  // Each unit's optimizer reads and writes its slices of the run's optimizer's tensors.
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : optimizer.state()) state.emplace(name, t);
  const std::vector<ElementRange> whole_extents = optimizer.state_extents(whole);
  unit_opts_.clear();
  for (const ElementRange& u : units_) {
    std::unique_ptr<Optimizer> o = make_optimizer(config, layout_, nullptr, u);
    MEMFIT_CHECK(o->name() == optimizer.name(), "optim",
                 "the per-unit optimizer is {}, the run's {}", o->name(), optimizer.name());
    const std::vector<ElementRange> extents = o->state_extents(u);
    std::vector<Tensor> bound;
    for (size_t i = 0; i < o->state_specs().size(); ++i) {
      const StateSpec& spec = o->state_specs()[i];
      if (spec.numel == 0) {
        bound.emplace_back();
        continue;
      }
      const auto it = state.find(spec.name);
      MEMFIT_CHECK(it != state.end(), "optim", "{}: the run's optimizer has no state '{}'",
                   optimizer.name(), spec.name);
      bound.push_back(
          it->second.view(extents[i].begin - whole_extents[i].begin, {extents[i].size()}));
    }
    o->bind_state(std::move(bound));
    unit_opts_.push_back(std::move(o));
  }
}

void BackwardUpdate::begin_step(float lr, float clip, Clip mode) {
  MEMFIT_CHECK(whole_ != nullptr, "optim", "--update-in-backward: a step before attach()");
  lr_ = lr;
  clip_ = mode == Clip::unit ? clip : 0;
  factor_ = 1;
  pass_ = mode == Clip::global && clip > 0 ? Pass::measure : Pass::step_unit;
  if (pass_ == Pass::measure) clip_ = clip;
}

void BackwardUpdate::zero() {
  micro_batches_ = 0;
  units_done_ = 0;
  std::fill(checks_.begin(), checks_.end(), UnitGradCheck{});
}

void BackwardUpdate::begin_micro_batch() {
  MEMFIT_CHECK(pass_ != Pass::idle, "optim",
               "--update-in-backward: a training forward without begin_step (the step's "
               "learning rate) before it");
  // Global clipping's second pass is the same micro-batch again; any other is refused.
  MEMFIT_CHECK(micro_batches_ == 0 || (pass_ == Pass::step_global && micro_batches_ == 1),
               "optim",
               "--update-in-backward steps the optimizer inside each backward, so a step has one "
               "micro-batch (--grad-accum 1)");
  if (micro_batches_ == 0) steps_before_ = whole_->steps_taken();
  ++micro_batches_;
  units_done_ = 0;
  kernels::zero(edges_);
}

void BackwardUpdate::enter_backward(int layer) {
  // The previous block's update finished inside its done(): the slot is free.
  kernels::zero(slot_);
  const ElementRange unit = units_[static_cast<size_t>(1 + layer)];
  layout_.bind(views_, slot_.view(0, {unit.size()}), unit);
}

void BackwardUpdate::done(int part) {
  const int n_layer = static_cast<int>(units_.size()) - 2;
  if (part == n_layer) {
    update_unit(units_.size() - 1, edges_.view(tail_at_, {units_.back().size()}));
  } else if (part >= 0) {
    update_unit(static_cast<size_t>(1 + part),
                slot_.view(0, {units_[static_cast<size_t>(1 + part)].size()}));
  } else {
    update_unit(0, edges_.view(0, {units_.front().size()}));
    MEMFIT_CHECK(units_done_ == static_cast<int>(units_.size()), "optim",
                 "--update-in-backward: {} of {} units finished in the backward", units_done_,
                 units_.size());
    if (pass_ == Pass::measure) {
      // The global norm, and the ordinary step's factor from it (train/grad_clip.h's
      // clip_factor, the same arithmetic): the second pass steps every unit by it. A
      // non-finite norm steps nothing (the run stops).
      const BackwardUpdateResult r = result();
      pass_ = Pass::idle;
      if (r.finite && std::isfinite(r.sum_squares)) {
        factor_ = static_cast<float>(std::min(1.0, clip_ / (std::sqrt(r.sum_squares) + 1e-6)));
        pass_ = Pass::step_global;
      }
      return;
    }
    // One step taken, as Optimizer::step counts it (each unit's optimizer started from the same
    // count).
    whole_->set_steps_taken(steps_before_ + 1);
    pass_ = Pass::idle;
  }
}

void BackwardUpdate::update_unit(size_t unit, const Tensor& grads) {
  ++units_done_;
  float scale = 1.0f;
  if (pass_ == Pass::step_global) {
    // The measuring pass checked these very gradients (the same forward and backward).
    scale = factor_;
  } else {
    // The ordinary step's check of this unit (train/update.cpp: kernels::sum_squares of the
    // unit's part of the slab).
    const double ss = kernels::sum_squares(grads);
    checks_[unit] = {std::isfinite(ss), ss};
    if (pass_ == Pass::measure) return;
    if (!std::isfinite(ss)) return;  // the run stops (result().finite), this unit unstepped
    if (clip_ > 0) scale = static_cast<float>(std::min(1.0, clip_ / (std::sqrt(ss) + 1e-6)));
  }
  const ElementRange r = units_[unit];
  Optimizer& o = *unit_opts_[unit];
  o.set_steps_taken(steps_before_);
  Tensor w = weights_.view(r.begin, {r.size()});
  if (working_.defined()) {
    Tensor h = working_.view(r.begin, {r.size()});
    o.step_master(w, h, grads, lr_, scale);
  } else {
    o.step(w, grads, lr_, scale);
  }
}

BackwardUpdateResult BackwardUpdate::result() const {
  BackwardUpdateResult r;
  for (const UnitGradCheck& c : checks_) {  // unit order, as update.cpp adds them
    r.finite = r.finite && c.finite;
    r.sum_squares += c.sum_squares;
  }
  return r;
}

}  // namespace memfit
