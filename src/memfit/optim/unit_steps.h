// The optimizer stepped one unit at a time as the backward finishes each unit's gradients (Note
// [Update in backward], docs/notes/update-in-backward.md): what both gradient stores of
// --update-in-backward share, the one-process BackwardUpdate (backward_update.h) and ZeRO 2-3's
// per-unit reduce-scatter (dist/zero/unit_grads.h, GradSharding::steps). Over this rank's range
// (the whole layout in one process, the rank's shard under ZeRO) each unit's part is stepped by
// an optimizer made over that part, whose state is bound to the run's optimizer's own tensors
// (Optimizer::state_extents): one optimizer's state for checkpoints, resume and the planner,
// and a part's update is the whole range's on its elements, so without clipping the weights and
// the state are bit for bit the ordinary step's. Global clipping takes two passes (LOMO's): a
// measuring backward that only takes each part's sum of squares, then the same micro-batch again,
// stepping every part by the ordinary step's factor; per-unit clipping (another algorithm) one.
// With the state offloaded the parts are stepped by a UnitStateStream instead (the offloaded
// optimizer, streaming each unit's state from its files as the backward ends it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/model/grad_store.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"
#include "memfit/optim/tensor_split.h"

namespace memfit {

// What the step's fused updates found, for the log and the non-finite stop.
struct BackwardUpdateResult {
  // Every unit's gradients were finite (a unit that was not is left unstepped, and with global
  // clipping none is; the run stops).
  bool finite = true;
  // Each rank's parts' squared 2-norms added in unit order, the ranks' sums added in rank order
  // (as the ordinary step's check adds them), before any clipping (global clipping: the
  // measuring pass's).
  double sum_squares = 0;
  // The gradients are summed over this many ranks (the ordinary step's grad_accum x ranks):
  // the norm and the steps are the mean's, sqrt(sum_squares) / mean_over.
  int mean_over = 1;
};

// Where the parts' optimizer state (and master weights) live when they are not the run's
// optimizer's tensors in RAM: files on disk (--offload-optimizer nvme:
// offload/offloaded_optimizer.h), each unit's read, stepped and written back as the backward
// finishes it, the next units' read ahead (Note [Update in backward], "With offload").
class UnitStateStream {
 public:
  virtual ~UnitStateStream() = default;
  virtual int64_t steps_taken() const = 0;
  // A stepping pass's training forward starts: the first units' state may be read ahead.
  virtual void begin_pass() = 0;
  // Unit u's part (`grads`: its gradients, element 0 the part's first) stepped by `lr` and
  // `scale` from the count `steps`, in the backward's order (the tail, the blocks top down, the
  // embeddings); with `step` false left as it is (its gradients were not finite).
  virtual void step_unit(size_t u, const Tensor& grads, float lr, float scale, int64_t steps,
                         bool step) = 0;
  // Every unit was given: its writes done, the count `steps` from here on.
  virtual void end_pass(int64_t steps) = 0;
};

class UnitSteps {
 public:
  // How a step's --clip applies (clip <= 0: none, one pass).
  enum class Clip {
    unit,    // each unit by its own norm, in one pass
    global,  // by the global norm: a measuring pass, then the stepping pass (second_pass())
  };
  // The forward+backward passes a step with `clip` and `mode` runs: 2 for global clipping
  // (the measuring pass, then the stepping pass), else 1. begin_step decides by it, and the
  // planner prices a run's step by it (RunSpec::backward_passes).
  static int passes(float clip, Clip mode) { return clip > 0 && mode == Clip::global ? 2 : 1; }
  // Every rank's {finite (1 or 0), sum of squares}, in rank order, from this rank's (a
  // collective over the ranks that share the step; absent in one process).
  using RankChecks = std::function<std::vector<UnitGradCheck>(const UnitGradCheck& mine)>;

  // Over `range` (this rank's: the whole layout, or its shard) of `layout`'s units, the
  // gradients summed over `ranks` ranks (the steps take their mean, as the ordinary step does).
  UnitSteps(const ParamLayout& layout, ElementRange range, RankChecks rank_checks = {},
            int ranks = 1);
  UnitSteps(const UnitSteps&) = delete;
  UnitSteps& operator=(const UnitSteps&) = delete;

  // The optimizer over range() whose state the parts' steps use, the weights of record it steps
  // (f32 master weights, or the working weights themselves) starting at layout element
  // `weights_begin`, and with master weights the working copy, rounded from them in the same
  // pass, starting at `working_begin`. Before the first step.
  void attach(const OptimConfig& config, Optimizer& optimizer, Tensor weights,
              int64_t weights_begin, Tensor working, int64_t working_begin);
  // Called with each part just stepped (its layout elements): a working copy kept other than
  // as a slab, which `attach` then has none of (--precision fp8's stored weights, Note [FP8],
  // "Storage"), is refreshed from the part's master weights there. Before the first step.
  void set_stepped_hook(std::function<void(ElementRange part)> hook) {
    stepped_ = std::move(hook);
  }
  // The same with the state in `stream` (--offload-optimizer): each part stepped by it.
  void attach(UnitStateStream& stream);

  // --tp (Note [Update in backward], "Under --tp"): what a unit's part needs of the tensor
  // group before its step, and how its squares add up to the whole model's norm.
  struct TensorSplit {
    // Sums the part's partial gradients (layout elements `part`, in `grads`) over the tensor
    // group in place: the replicated key/value heads', --sp's norms'. A collective.
    std::function<void(ElementRange part, const Tensor& grads)> sum_partials;
    // Per parameter of the layout, the share of its squares this rank adds to the group's sum:
    // 1 for a slice, 1/R for a key/value head replicated on R ranks, 0 for a parameter every
    // rank holds whole (its squares counted once).
    std::vector<double> weights;
    // `values` summed over the tensor group in rank order, on every rank. A collective.
    std::function<void(std::span<double> values)> all_reduce;
    // The group the parts' optimizers take in their update where it groups elements across
    // the slices (Adam-mini's row-parallel rows, 4-bit AdamW's rank-1 maxima:
    // optim/tensor_split.h); handed to each part's optimizer (in RAM; the offloaded one's
    // pieces take it from the run). With it active, --clip 0's pass agrees each unit's finite
    // flag over the group before its step (the flag and the squares all-reduced, as per-unit
    // clipping does), so no rank skips a unit whose update the others' collectives wait in.
    ::memfit::TensorSplit optimizer;
  };
  // Before the first step.
  void set_tensor_split(TensorSplit split);

  // --pp (Note [Update in backward], "Under --pp"): every stage's parts of the norm, gathered
  // over the pipeline group in stage order, from this stage's (a collective over the stages).
  using StageChecks =
      std::function<std::vector<UnitGradCheck>(const std::vector<UnitGradCheck>& mine)>;
  // Before the first step. A stage's backward ends before the stages below it have run
  // theirs, so the norm is taken after the pass through every stage (end_pipeline_pass), not
  // in end_backward: a collective there would wait for a stage that waits for this one.
  void set_pipeline(StageChecks stages);
  // --pp: the pass through every stage is over (this stage's backward ended): the norm over
  // the stages (a collective), and after a measuring pass the global factor, so that
  // second_pass() says whether to run the stepping pass.
  void end_pipeline_pass();
  // A new step's learning rate and clipping. Before its forward.
  void begin_step(float lr, float clip, Clip mode);
  // Global clipping: the measuring pass is done and finite, so the caller runs the same
  // micro-batch's forward and backward again, which steps every part by the global factor.
  bool second_pass() const { return pass_ == Pass::step_global; }
  // After the step's backward (every rank's, in rank order): what the updates found.
  BackwardUpdateResult result() const { return result_; }

  // The store's side. A training forward starts (checks that a step was begun, and that it has
  // one micro-batch, or global clipping's second).
  void begin_micro_batch();
  // Unit u's gradients (of its part in range(): range() ∩ unit u, element 0 its first) are
  // final: check them, and step the part (not in the measuring pass).
  void unit_done(size_t u, const Tensor& grads);
  // The backward is over (every unit done): the ranks' checks gathered (a collective), the
  // global factor taken after a measuring pass, else the optimizer's step count advanced.
  void end_backward();
  // Each unit's part of range() (empty where the unit is outside it).
  const std::vector<ElementRange>& parts() const { return parts_; }
  const std::vector<UnitGradCheck>& checks() const { return checks_; }

 private:
  // What the next backward does: nothing begun; step each part (clipped by its unit's own norm
  // where clip_ > 0); only measure (global clipping's first pass); step by factor_ (its second).
  enum class Pass { idle, step_unit, measure, step_global };

  const ParamLayout layout_;  // its own copy: made before the model
  ElementRange range_;
  RankChecks rank_checks_;
  int ranks_ = 1;
  std::vector<ElementRange> parts_;
  Optimizer* whole_ = nullptr;
  UnitStateStream* stream_ = nullptr;  // instead of whole_ (and opts_)
  std::vector<std::unique_ptr<Optimizer>> opts_;  // per part (null where empty)
  Tensor weights_, working_;
  int64_t weights_begin_ = 0, working_begin_ = 0;
  std::vector<UnitGradCheck> checks_;
  // --tp: each parameter's part's check (its squares unweighted), taken as its unit finishes;
  // end_backward adds them in layout order, as the ordinary update's tensor check does.
  std::unique_ptr<TensorSplit> tensor_;
  std::vector<UnitGradCheck> param_checks_;
  // --tp: the part's squares, split (weighted) and replicated, into param_checks_.
  UnitGradCheck tensor_unit_check(ElementRange part, const Tensor& grads, double& split,
                                  double& replicated);
  // --tp: this rank's {finite, split squares} and replicated squares in layout order.
  void tensor_totals(UnitGradCheck& split, double& replicated) const;
  BackwardUpdateResult result_;
  // --pp: this stage's parts of the norm from its last backward (its units in unit order in
  // one data rank, else each data rank's sum, or the tensor group's), which end_pipeline_pass
  // adds with the other stages'; whether they wait for it, and whether the pass measured.
  StageChecks stages_;
  std::vector<UnitGradCheck> stage_parts_;
  bool stages_pending_ = false, measured_ = false;
  // The global factor from the norm's sum of squares (train/grad_clip.h's arithmetic): the
  // stepping pass is next where the norm is finite.
  void take_factor();
  Pass pass_ = Pass::idle;
  std::function<void(ElementRange)> stepped_;
  float lr_ = 0, clip_ = 0, factor_ = 1;
  int64_t steps_before_ = 0;
  int micro_batches_ = 0, units_done_ = 0;
};

}  // namespace memfit
