// Each unit's part stepped as the backward finishes it (unit_steps.h; Note [Update in backward],
// docs/notes/update-in-backward.md).
#include "memfit/optim/unit_steps.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/residual.h"

namespace memfit {

UnitSteps::UnitSteps(const ParamLayout& layout, ElementRange range, RankChecks rank_checks,
                     int ranks)
    : layout_(layout), range_(range), rank_checks_(std::move(rank_checks)), ranks_(ranks) {
  MEMFIT_CHECK(ranks >= 1, "optim", "gradients summed over {} ranks", ranks);
  for (const ElementRange& u : unit_ranges(layout_)) parts_.push_back(range_.intersect(u));
  checks_.resize(parts_.size());
}

void UnitSteps::attach(const OptimConfig& config, Optimizer& optimizer, Tensor weights,
                       int64_t weights_begin, Tensor working, int64_t working_begin) {
  MEMFIT_CHECK(optimizer.range() == range_ && weights_begin <= range_.begin &&
                   weights_begin + weights.numel() >= range_.end &&
                   (!working.defined() || (working_begin <= range_.begin &&
                                           working_begin + working.numel() >= range_.end)),
               "optim",
               "--update-in-backward steps [{}, {}): an optimizer over [{}, {}) and weights "
               "over [{}, {})",
               range_.begin, range_.end, optimizer.range().begin, optimizer.range().end,
               weights_begin, weights_begin + weights.numel());
  whole_ = &optimizer;
  stream_ = nullptr;
  weights_ = std::move(weights);
  working_ = std::move(working);
  weights_begin_ = weights_begin;
  working_begin_ = working_begin;
  // Each part's optimizer reads and writes its slices of the run's optimizer's tensors.
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : optimizer.state()) state.emplace(name, t);
  const std::vector<ElementRange> range_extents = optimizer.state_extents(range_);
  opts_.clear();
  for (const ElementRange& part : parts_) {
    if (part.empty()) {
      opts_.emplace_back();
      continue;
    }
    std::unique_ptr<Optimizer> o = make_optimizer(config, layout_, nullptr, part);
    const std::vector<ElementRange> extents = o->state_extents(part);
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
          it->second.view(extents[i].begin - range_extents[i].begin, {extents[i].size()}));
    }
    o->bind_state(std::move(bound));
    if (tensor_) ::memfit::set_tensor_split(*o, tensor_->optimizer);
    // The update's scratch (APOLLO, GaLore) is the run's optimizer's: the parts update one at
    // a time, and the planner counts that one buffer.
    if (o->scratch_elements() > 0) o->set_scratch(optimizer.scratch_buffer());
    opts_.push_back(std::move(o));
  }
}

void UnitSteps::attach(UnitStateStream& stream) {
  whole_ = nullptr;
  opts_.clear();
  stream_ = &stream;
}

void UnitSteps::set_tensor_split(TensorSplit split) {
  MEMFIT_CHECK(split.weights.size() == layout_.params().size() && split.sum_partials &&
                   split.all_reduce,
               "optim", "--update-in-backward under --tp: {} weights for {} parameters",
               split.weights.size(), layout_.params().size());
  tensor_ = std::make_unique<TensorSplit>(std::move(split));
  param_checks_.assign(layout_.params().size(), UnitGradCheck{});
  for (auto& o : opts_)
    if (o) ::memfit::set_tensor_split(*o, tensor_->optimizer);
}

UnitGradCheck UnitSteps::tensor_unit_check(ElementRange part, const Tensor& grads, double& split,
                                           double& replicated) {
  // Each parameter's part on its own (update.cpp's check_tensor_slices: a slice's squares
  // weighted for the group's sum, a whole parameter's apart).
  UnitGradCheck all;
  const std::vector<ParamInfo>& ps = layout_.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const ElementRange q = part.intersect({ps[i].offset, ps[i].offset + ps[i].numel});
    if (q.empty()) continue;
    const double ss = kernels::sum_squares(grads.view(q.begin - part.begin, {q.size()}));
    param_checks_[i] = {std::isfinite(ss), ss};
    all.finite = all.finite && std::isfinite(ss);
    all.sum_squares += ss;
    if (tensor_->weights[i] == 0.0)
      replicated += ss;
    else
      split += tensor_->weights[i] * ss;
  }
  return all;
}

void UnitSteps::tensor_totals(UnitGradCheck& split, double& replicated) const {
  // In layout order over range(), as check_tensor_slices adds them.
  split = {};
  replicated = 0;
  const std::vector<ParamInfo>& ps = layout_.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (range_.intersect({ps[i].offset, ps[i].offset + ps[i].numel}).empty()) continue;
    const UnitGradCheck& c = param_checks_[i];
    split.finite = split.finite && c.finite;
    if (tensor_->weights[i] == 0.0)
      replicated += c.sum_squares;
    else
      split.sum_squares += tensor_->weights[i] * c.sum_squares;
  }
}

void UnitSteps::begin_step(float lr, float clip, Clip mode) {
  MEMFIT_CHECK(whole_ != nullptr || stream_ != nullptr, "optim",
               "--update-in-backward: a step before attach()");
  lr_ = lr;
  clip_ = clip;
  factor_ = 1;
  micro_batches_ = 0;
  pass_ = passes(clip, mode) == 2 ? Pass::measure : Pass::step_unit;
  if (mode == Clip::global && pass_ == Pass::step_unit) clip_ = 0;
  result_ = {};
  result_.mean_over = ranks_;
  stages_pending_ = measured_ = false;
}

void UnitSteps::begin_micro_batch() {
  MEMFIT_CHECK(pass_ != Pass::idle, "optim",
               "--update-in-backward: a training forward without begin_step (the step's "
               "learning rate) before it");
  // Global clipping's second pass is the same micro-batch again; any other is refused.
  MEMFIT_CHECK(micro_batches_ == 0 || (pass_ == Pass::step_global && micro_batches_ == 1),
               "optim",
               "--update-in-backward steps the optimizer inside each backward, so a step has one "
               "micro-batch (--grad-accum 1)");
  if (micro_batches_ == 0) {
    steps_before_ = whole_ ? whole_->steps_taken() : stream_->steps_taken();
    std::fill(checks_.begin(), checks_.end(), UnitGradCheck{});
    std::fill(param_checks_.begin(), param_checks_.end(), UnitGradCheck{});
  }
  // A stepping pass: the stream reads the first units' state while the forward runs.
  if (stream_ && pass_ != Pass::measure) stream_->begin_pass();
  ++micro_batches_;
  units_done_ = 0;
}

void UnitSteps::unit_done(size_t u, const Tensor& grads) {
  const ElementRange part = parts_.at(u);
  MEMFIT_CHECK(grads.numel() == part.size(), "optim",
               "unit {}'s gradients: {} elements for a part of {}", u, grads.numel(), part.size());
  ++units_done_;
  if (part.empty()) return;
  // --tp: the part's partial sums over the tensor group first, in every pass (global
  // clipping's stepping pass computed the gradients again). Every tensor rank holds the same
  // parts (one data index), so every rank calls the same collectives.
  if (tensor_) tensor_->sum_partials(part, grads);
  // The ordinary step's arithmetic (train/update.cpp): the factor from the mean's norm, the
  // scale that factor over the ranks the gradients are summed over.
  const double over = ranks_;
  float scale = 1.0f / static_cast<float>(ranks_);
  if (pass_ == Pass::step_global) {
    // The measuring pass checked these very gradients (the same forward and backward).
    scale = factor_ / static_cast<float>(ranks_);
  } else {
    // The ordinary step's check of this part (train/update.cpp: kernels::sum_squares of each
    // unit's part of the summed gradients).
    double ss = 0;
    bool finite = true;
    if (tensor_) {
      double split = 0, replicated = 0;
      checks_[u] = tensor_unit_check(part, grads, split, replicated);
      finite = checks_[u].finite;
      ss = checks_[u].sum_squares;
      if (pass_ == Pass::step_unit && (clip_ > 0 || tensor_->optimizer.active())) {
        // The unit's own norm is the whole unit's over the group: its slices' squares summed
        // over the tensor group, the whole parameters' once (before any rank returns, so
        // every rank takes the collective). Without clipping, an optimizer that takes the
        // group needs the finite flag alone agreed: every rank steps the unit, or none.
        double v[2] = {split, finite ? 0.0 : 1.0};
        tensor_->all_reduce(v);
        ss = v[0] + replicated;
        finite = v[1] == 0 && std::isfinite(ss);
      }
    } else {
      ss = kernels::sum_squares(grads);
      finite = std::isfinite(ss);
      checks_[u] = {finite, ss};
    }
    if (pass_ == Pass::measure) return;
    if (!finite) {  // the run stops (result().finite), this part unstepped
      if (stream_) stream_->step_unit(u, grads, lr_, 0, steps_before_, false);
      return;
    }
    if (clip_ > 0)
      scale = static_cast<float>(std::min(1.0, clip_ / (std::sqrt(ss) / over + 1e-6))) /
              static_cast<float>(ranks_);
  }
  if (stream_) {
    stream_->step_unit(u, grads, lr_, scale, steps_before_, true);
    return;
  }
  Optimizer& o = *opts_[u];
  o.set_steps_taken(steps_before_);
  Tensor w = weights_.view(part.begin - weights_begin_, {part.size()});
  if (working_.defined()) {
    Tensor h = working_.view(part.begin - working_begin_, {part.size()});
    o.step_master(w, h, grads, lr_, scale);
  } else {
    o.step(w, grads, lr_, scale);
  }
  if (stepped_) stepped_(part);
}

void UnitSteps::end_backward() {
  MEMFIT_CHECK(units_done_ == static_cast<int>(parts_.size()), "optim",
               "--update-in-backward: {} of {} units finished in the backward", units_done_,
               parts_.size());
  if (pass_ != Pass::step_global && tensor_) {
    // --tp (update.cpp's tensor_check): this rank's slices' squares and whole parameters'
    // squares, each added over the data group's ranks in rank order, then the slices' summed
    // over the tensor group and the whole parameters' added once.
    UnitGradCheck split;
    double replicated = 0;
    tensor_totals(split, replicated);
    const UnitGradCheck whole{true, replicated};
    const std::vector<UnitGradCheck> splits =
        rank_checks_ ? rank_checks_(split) : std::vector<UnitGradCheck>{split};
    const std::vector<UnitGradCheck> wholes =
        rank_checks_ ? rank_checks_(whole) : std::vector<UnitGradCheck>{whole};
    double v[2] = {0, 0}, once = 0;
    bool finite = true;
    for (const UnitGradCheck& c : splits) {
      finite = finite && c.finite;
      v[0] += c.sum_squares;
    }
    for (const UnitGradCheck& c : wholes) once += c.sum_squares;
    v[1] = finite ? 0.0 : 1.0;
    tensor_->all_reduce(v);
    result_ = {};
    result_.mean_over = ranks_;
    result_.finite = v[1] == 0;
    result_.sum_squares = v[0] + once;
    stage_parts_.assign(1, UnitGradCheck{result_.finite, result_.sum_squares});
  } else if (pass_ != Pass::step_global) {
    // This rank's parts in unit order, then the ranks in rank order (update.cpp's check_step).
    UnitGradCheck mine;
    for (const UnitGradCheck& c : checks_) {
      mine.finite = mine.finite && c.finite;
      mine.sum_squares += c.sum_squares;
    }
    const std::vector<UnitGradCheck> ranks =
        rank_checks_ ? rank_checks_(mine) : std::vector<UnitGradCheck>{mine};
    result_ = {};
    result_.mean_over = ranks_;
    for (const UnitGradCheck& c : ranks) {
      result_.finite = result_.finite && c.finite;
      result_.sum_squares += c.sum_squares;
    }
    // --pp: in one data rank the stage's units, as the ordinary --pp check gathers them (so
    // the stages' units in stage order add as one process's do), else its ranks' sums.
    stage_parts_ = rank_checks_ ? ranks : checks_;
  }
  // --pp: the stages' norm once every stage's backward is done (end_pipeline_pass).
  if (stages_ && pass_ != Pass::step_global) stages_pending_ = true;
  if (pass_ == Pass::measure) {
    pass_ = Pass::idle;
    if (stages_) {
      measured_ = true;
      return;
    }
    take_factor();
    return;
  }
  // One step taken, as Optimizer::step counts it (each part's optimizer started from the same
  // count).
  if (stream_) stream_->end_pass(steps_before_ + 1);
  else whole_->set_steps_taken(steps_before_ + 1);
  pass_ = Pass::idle;
}

void UnitSteps::take_factor() {
  // The global norm, and the ordinary step's factor from it (train/grad_clip.h's clip_factor,
  // the same arithmetic): the second pass steps every part by it. A non-finite norm steps
  // nothing (the run stops).
  if (result_.finite && std::isfinite(result_.sum_squares)) {
    factor_ = static_cast<float>(
        std::min(1.0, clip_ / (std::sqrt(result_.sum_squares) / double(ranks_) + 1e-6)));
    pass_ = Pass::step_global;
  }
}

void UnitSteps::set_pipeline(StageChecks stages) {
  MEMFIT_CHECK(static_cast<bool>(stages), "optim", "--update-in-backward under --pp: no gather");
  stages_ = std::move(stages);
}

void UnitSteps::end_pipeline_pass() {
  if (!stages_pending_) return;
  stages_pending_ = false;
  // Every stage's parts in stage order, added from 0 (update.cpp's pipeline_check).
  const std::vector<UnitGradCheck> all = stages_(stage_parts_);
  result_ = {};
  result_.mean_over = ranks_;
  for (const UnitGradCheck& c : all) {
    result_.finite = result_.finite && c.finite;
    result_.sum_squares += c.sum_squares;
  }
  if (measured_) {
    measured_ = false;
    take_factor();
  }
}

}  // namespace memfit
