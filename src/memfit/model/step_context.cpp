#include "memfit/model/step_context.h"

#include <cstring>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/fill.h"
#include "memfit/model/step_plan.h"

namespace memfit {

StepContext::StepContext(StepPlan plan, std::vector<Tensor> views)
    : plan_(std::make_unique<StepPlan>(std::move(plan))), views_(std::move(views)) {
  MEMFIT_CHECK(plan_ != nullptr && views_.size() == plan_->buffers.size(), "step",
               "a running step needs one view per planned buffer");
  for (size_t i = 0; i < plan_->buffers.size(); ++i) {
    index_.emplace(plan_->buffers[i].tag, i);
    if (plan_->buffers[i].category == Category::grads) grad_units_.push_back(i);
  }
}

StepContext::StepContext(StepContext&&) noexcept = default;

TensorGroup& StepContext::tensor_group() const {
  static const std::unique_ptr<TensorGroup> single = make_single_tensor_group();
  return group_ ? *group_ : *single;
}
StepContext& StepContext::operator=(StepContext&&) noexcept = default;
StepContext::~StepContext() = default;

const StepPlan& StepContext::plan() const {
  MEMFIT_CHECK(running(), "step", "a planning context has no plan yet");
  return *plan_;
}

void StepContext::enter(PhaseKind kind, int layer) {
  const Phase phase{kind, layer};
  if (!running()) {
    schedule_.push_back({phase, {}});
    return;
  }
  const auto& phases = plan_->phases;
  int next = 0;
  if (phase_ + 1 < static_cast<int>(phases.size()) && phases[phase_ + 1] == phase)
    next = phase_ + 1;
  else
    MEMFIT_CHECK(phases.front() == phase, "step",
                 "entered '{}' after '{}': the engine left the step plan it recorded",
                 phase.name(), phase_ < 0 ? "nothing" : phases[phase_].name());
  if (poison_) poison_edges(next == 0 ? -1 : phase_, next);
  phase_ = next;
  if (enter_hook_) enter_hook_(next);
  if (observer_) observer_->step_phase(next);
  // Note [Gradients by lifetime]: a gradient unit in the arena is born here, from zero (the
  // step's code adds into it); its bytes held activations until now.
  for (size_t i : grad_units_)
    if (plan_->buffers[i].lifetime.spans.front().first == next) {
      kernels::zero(views_[i]);
      if (observer_) observer_->step_use(i, Access::write);
    }
}

void StepContext::finish() {
  if (!running()) return;
  // The gradient units born in this micro-batch are read after it, by the update: their spans
  // reach its last phase (and they are not poisoned there).
  if (observer_)
    for (size_t i : grad_units_)
      if (plan_->buffers[i].lifetime.spans.front().first <= phase_)
        observer_->step_use(i, Access::read);
  if (poison_) poison_edges(phase_, -1);
  if (observer_) observer_->step_finish();
}

// Note [Step arena]: the bytes of a buffer between its spans may hold another buffer, and its
// old value is dead when a span opens, so the check makes both visibly garbage: all bits set is
// a NaN in f32, bf16 and f16; token ids become 0 (a valid token, but the wrong one).
void StepContext::poison_edges(int ended, int begins) {
  for (size_t i = 0; i < views_.size(); ++i) {
    bool hit = begins == 0;  // a new micro-batch: nothing from before is live
    // Gradient units live on after the last phase, for the update (Note [Gradients by
    // lifetime]): the next micro-batch's start is their end.
    const bool outlives = plan_->buffers[i].category == Category::grads;
    for (const LiveSpan& s : plan_->buffers[i].lifetime.spans)
      hit = hit || (s.last == ended && !outlives) || s.first == begins;
    if (!hit) continue;
    Tensor& t = views_[i];
    std::memset(t.raw_data(), t.dtype() == DType::i32 ? 0 : 0xff, t.nbytes());
  }
}

Tensor StepContext::use(const std::string& tag, Access access) {
  if (running()) {
    auto it = index_.find(tag);
    MEMFIT_CHECK(it != index_.end(), "step", "no buffer '{}' in the step plan", tag);
    if (observer_) observer_->step_use(it->second, access);
    return views_[it->second];
  }
  MEMFIT_CHECK(!schedule_.empty(), "step", "'{}' used outside any phase", tag);
  schedule_.back().use(tag, access);
  return {};
}

Tensor StepContext::write(const std::string& tag, const Shape& shape, DType dtype,
                          Category category) {
  if (!running()) {
    auto [it, added] = index_.emplace(tag, buffers_.size());
    if (added) {
      buffers_.push_back({tag, shape, dtype, category, {}, 0});
    } else {
      const BufferSpec& b = buffers_[it->second];
      MEMFIT_CHECK(b.shape == shape && b.dtype == dtype && b.category == category, "step",
                   "'{}' written as {} {} {} and as {} {} {}", tag, b.shape, dtype_name(b.dtype),
                   category_name(b.category), shape, dtype_name(dtype), category_name(category));
    }
  }
  Tensor t = use(tag, Access::write);
  MEMFIT_CHECK(!running() || (t.shape() == shape && t.dtype() == dtype), "step",
               "'{}' written as {} {}, planned as {} {}", tag, shape, dtype_name(dtype),
               t.shape(), dtype_name(t.dtype()));
  return t;
}

Tensor StepContext::write_again(const std::string& tag) {
  if (running()) return use(tag, Access::write);
  auto it = index_.find(tag);
  MEMFIT_CHECK(it != index_.end(), "step", "'{}' written again before any phase wrote it", tag);
  const BufferSpec b = buffers_[it->second];
  return write(tag, b.shape, b.dtype, b.category);
}

// Planning, a read of a tag no earlier phase wrote is caught where the record becomes lifetimes
// (step_plan.cpp's derive_lifetimes), which names the phase and the tag.
Tensor StepContext::read(const std::string& tag) { return use(tag, Access::read); }

Tensor StepContext::scratch(const std::string& tag, size_t bytes) {
  const int64_t floats = static_cast<int64_t>((bytes + 3) / 4);
  if (!running()) {
    auto [it, added] = index_.emplace(tag, buffers_.size());
    if (added)
      buffers_.push_back({tag, {floats}, DType::f32, Category::workspace, {}, 0});
    else if (buffers_[it->second].shape[0] < floats)
      buffers_[it->second].shape = {floats};
  }
  return use(tag, Access::write);
}

const Tensor& StepContext::view(const std::string& tag) const {
  auto it = index_.find(tag);
  MEMFIT_CHECK(running() && it != index_.end(), "step", "no buffer '{}' (reserve() first)", tag);
  return views_[it->second];
}

}  // namespace memfit
