// Where a step's gradients live when they are not one f32 slab in RAM that the backward adds
// into: a store that gives each unit (unit_ranges in model/param_layout.h: the embeddings, each
// block, the tail) a buffer while its backward runs. Two stores today: the per-unit reduction over
// ranks (dist/zero/unit_grads.h: Note [Sharded gradients], and bf16 gradients), which sums the
// units into an accumulator the update reads (summed()); and --offload-grads nvme's
// (offload/offloaded_grads.h: each finished unit written to a file, read back before the next
// micro-batch's backward of it, the update reading the file: unit_checks()). The Transformer
// calls it at a new step, a training forward, a block's backward entered, a part finished; it is
// the model's side of the seam, so it stays in model/ (Note [State placement]).
// Note [NVMe offload], "Gradients on disk" (docs/notes/offload.md).
#pragma once

#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/model/param_layout.h"
#include "memfit/core/element_range.h"

namespace memfit {

// What the update needs of one unit's final gradients (in the slab's order of units, the
// global norm adds them: update.cpp).
struct UnitGradCheck {
  bool finite = true;
  double sum_squares = 0;
};

class GradStore {
 public:
  virtual ~GradStore() = default;
  // The views the step writes: the edge units always, a block once its backward is entered.
  virtual const ModelWeights& views() const = 0;
  // A new step: the next micro-batch is the step's first (its gradients start from zero).
  virtual void zero() = 0;
  // A training forward starts.
  virtual void begin_micro_batch() = 0;
  // Block `layer`'s backward starts.
  virtual void enter_backward(int layer) = 0;
  // The embeddings' backward starts (after every block's done()).
  virtual void enter_embedding_backward() {}
  // The backward finished a part: n_layer the tail, l block l, -1 the embeddings (the last).
  virtual void done(int part) = 0;
  // Where the store sums the gradients itself (the per-unit reduction): the summed gradients
  // the update reads, over sums_range(). Null where the update reads them from the store unit
  // by unit (a file: unit_checks).
  virtual Tensor* summed() { return nullptr; }
  virtual ElementRange sums_range() const { return {}; }
  // After the step's last backward (a store without summed()): each unit's check of its final
  // gradients (unscaled in place first where the step has a loss scale), in unit order.
  virtual const std::vector<UnitGradCheck>& unit_checks() const {
    static const std::vector<UnitGradCheck> none;
    return none;
  }
};

}  // namespace memfit
